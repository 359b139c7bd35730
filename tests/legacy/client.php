<?php
// A legacy ActiveMQ application written with Debian's php-stomp extension (tests/legacy).
// Usage: php client.php PORT SCENARIO NAME; prints one line per event, ends with "done".
// Scenarios: queue (send, subscribe with client acks, ack), selector (topic subscription with a
// JMS selector), durable (client-id + activemq.subscriptionName, messages sent while away).
if (!extension_loaded('stomp')) {
    fwrite(STDERR, "php-stomp is not loaded: apt-get install -y php-cli php-stomp\n");
    exit(3);
}
[$script, $port, $scenario, $name] = $argv;
$broker = "tcp://127.0.0.1:$port";

function connect(string $broker, array $headers = []): Stomp {
    // ActiveMQ ends a DISCONNECTed connection in the background: for a moment its client-id is
    // still taken and a CONNECT with it is refused ("already connected"), so an application
    // that comes back at once with the same client-id tries again, as real ones do
    $tries = isset($headers['client-id']) ? 50 : 1;
    for ($try = 1; ; $try++) {
        try {
            $stomp = new Stomp($broker, 'guest', 'guest', $headers);
            $stomp->setReadTimeout(5);
            return $stomp;
        } catch (StompException $e) {
            if ($try >= $tries || !preg_match('/already connected|InvalidClientID/i', $e->getMessage())) {
                throw $e;
            }
            usleep(100000);
        }
    }
}

function receive(Stomp $stomp, int $count, bool $ack): void {
    for ($i = 0; $i < $count; $i++) {
        $frame = $stomp->readFrame();
        if ($frame === false) {
            echo "timeout\n";
            return;
        }
        echo "message {$frame->body}\n";
        if ($ack) {
            $stomp->ack($frame);
        }
    }
}

function nothing_more(Stomp $stomp): void {
    $stomp->setReadTimeout(1);
    echo $stomp->hasFrame() ? "unexpected {$stomp->readFrame()->body}\n" : "nothing more\n";
}

switch ($scenario) {
case 'queue':
    $stomp = connect($broker);
    foreach (['one', 'two', 'three'] as $body) {
        $stomp->send("/queue/$name", $body, ['persistent' => 'false']);
    }
    $stomp->subscribe("/queue/$name", ['ack' => 'client', 'activemq.prefetchSize' => '1']);
    receive($stomp, 3, true);
    $stomp->unsubscribe("/queue/$name");
    unset($stomp);
    break;
case 'selector':
    $stomp = connect($broker);
    $stomp->subscribe("/topic/$name", ['selector' => "color = 'red' AND size > 2"]);
    $stomp->send("/topic/$name", 'red-big', ['color' => 'red', 'size' => '5']);
    $stomp->send("/topic/$name", 'blue-big', ['color' => 'blue', 'size' => '5']);
    $stomp->send("/topic/$name", 'red-small', ['color' => 'red', 'size' => '1']);
    receive($stomp, 1, false);
    nothing_more($stomp);
    unset($stomp);
    break;
case 'durable':
    $durable = ['activemq.subscriptionName' => 'sub'];
    $subscriber = connect($broker, ['client-id' => $name]);
    // with a receipt: the subscription exists before this client disconnects
    $subscriber->subscribe("/topic/$name", $durable + ['receipt' => 'subscribed']);
    unset($subscriber); // disconnects: the subscription keeps collecting
    $publisher = connect($broker);
    $publisher->send("/topic/$name", 'away-1');
    $publisher->send("/topic/$name", 'away-2');
    $subscriber = connect($broker, ['client-id' => $name]);
    $subscriber->subscribe("/topic/$name", $durable + ['ack' => 'client']);
    receive($subscriber, 2, true);
    $subscriber->unsubscribe("/topic/$name");
    $subscriber->unsubscribe("/topic/$name", $durable);
    unset($subscriber, $publisher);
    break;
default:
    fwrite(STDERR, "unknown scenario $scenario\n");
    exit(2);
}
echo "done\n";
