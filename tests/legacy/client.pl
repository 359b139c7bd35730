#!/usr/bin/perl
# A legacy ActiveMQ application written with Debian's Net::Stomp (libnet-stomp-perl), tests/legacy.
# Usage: perl client.pl PORT SCENARIO NAME; prints one line per event, ends with "done".
# Scenarios as in client.php: queue, selector, durable.
use strict;
use warnings;

BEGIN {
    unless (eval { require Net::Stomp; 1 }) {
        print STDERR "Net::Stomp is missing: apt-get install -y libnet-stomp-perl\n";
        exit 3;
    }
}

$| = 1;
my ($port, $scenario, $name) = @ARGV;

sub connect_stomp {
    my (%headers) = @_;
    # ActiveMQ ends a DISCONNECTed connection in the background: for a moment its client-id is
    # still taken and a CONNECT with it is refused (InvalidClientIDException), so an application
    # that comes back at once with the same client-id tries again, as real ones do
    my $tries = exists $headers{'client-id'} ? 50 : 1;
    for my $try (1 .. $tries) {
        my $stomp = Net::Stomp->new({ hostname => '127.0.0.1', port => $port });
        my $frame = $stomp->connect({ login => 'guest', passcode => 'guest', %headers });
        return $stomp if $frame->command eq 'CONNECTED';
        my $message = $frame->headers->{message} // '';
        die "CONNECT refused: " . $frame->command . " $message\n"
            unless $try < $tries && $message =~ /InvalidClientID|already connected/i;
        select(undef, undef, undef, 0.1);
    }
}

sub receive {
    my ($stomp, $count, $ack) = @_;
    for (1 .. $count) {
        my $frame = $stomp->receive_frame({ timeout => 5 });
        if (!$frame) { print "timeout\n"; return; }
        print "message ", $frame->body, "\n";
        $stomp->ack({ frame => $frame }) if $ack;
    }
}

sub nothing_more {
    my ($stomp) = @_;
    my $frame = $stomp->receive_frame({ timeout => 1 });
    print $frame ? "unexpected " . $frame->body . "\n" : "nothing more\n";
}

if ($scenario eq 'queue') {
    my $stomp = connect_stomp();
    $stomp->send({ destination => "/queue/$name", body => $_, persistent => 'false' }) for qw(one two three);
    $stomp->subscribe({ destination => "/queue/$name", ack => 'client', 'activemq.prefetchSize' => 1 });
    receive($stomp, 3, 1);
    $stomp->unsubscribe({ destination => "/queue/$name" });
    $stomp->disconnect;
}
elsif ($scenario eq 'selector') {
    my $stomp = connect_stomp();
    $stomp->subscribe({ destination => "/topic/$name", selector => "color = 'red' AND size > 2",
                        receipt => 'subscribed' });
    my $receipt = $stomp->receive_frame({ timeout => 5 });
    die "no RECEIPT for SUBSCRIBE\n" unless $receipt && $receipt->command eq 'RECEIPT';
    $stomp->send({ destination => "/topic/$name", body => 'red-big', color => 'red', size => 5 });
    $stomp->send({ destination => "/topic/$name", body => 'blue-big', color => 'blue', size => 5 });
    $stomp->send({ destination => "/topic/$name", body => 'red-small', color => 'red', size => 1 });
    receive($stomp, 1, 0);
    nothing_more($stomp);
    $stomp->disconnect;
}
elsif ($scenario eq 'durable') {
    my %durable = ('activemq.subscriptionName' => 'sub');
    my $subscriber = connect_stomp('client-id' => $name);
    $subscriber->subscribe({ destination => "/topic/$name", %durable, receipt => 'subscribed' });
    my $receipt = $subscriber->receive_frame({ timeout => 5 });
    die "no RECEIPT for SUBSCRIBE\n" unless $receipt && $receipt->command eq 'RECEIPT';
    $subscriber->disconnect;    # the subscription keeps collecting
    my $publisher = connect_stomp();
    $publisher->send({ destination => "/topic/$name", body => $_ }) for qw(away-1 away-2);
    $subscriber = connect_stomp('client-id' => $name);
    $subscriber->subscribe({ destination => "/topic/$name", %durable, ack => 'client' });
    receive($subscriber, 2, 1);
    $subscriber->unsubscribe({ destination => "/topic/$name" });
    $subscriber->unsubscribe({ destination => "/topic/$name", %durable });
    $subscriber->disconnect;
    $publisher->disconnect;
}
else {
    print STDERR "unknown scenario $scenario\n";
    exit 2;
}
print "done\n";
