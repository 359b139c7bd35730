# A legacy ActiveMQ application written with Debian's Ruby stomp gem (ruby-stomp), tests/legacy.
# Usage: ruby client.rb PORT SCENARIO NAME; prints one line per event, ends with "done".
# Scenarios as in client.php: queue, selector, durable; this client speaks STOMP 1.2.
begin
  require 'stomp'
rescue LoadError
  warn 'the stomp gem is missing: apt-get install -y ruby-stomp'
  exit 3
end
require 'timeout'

$stdout.sync = true
port, scenario, name = ARGV
port = Integer(port)

# ActiveMQ ends a DISCONNECTed connection in the background: for a moment its client-id is still
# taken and a CONNECT with it is refused ("already connected"), so an application that comes
# back at once with the same client-id tries again, as real ones do
def connect_stomp(port, headers = {})
  tries = headers.key?('client-id') ? 50 : 1
  (1..tries).each do |try|
    conn = Stomp::Connection.new(
      hosts: [{ login: 'guest', passcode: 'guest', host: '127.0.0.1', port: port }],
      reliable: false,
      connect_headers: { 'accept-version' => '1.2', 'host' => '/' }.merge(headers)
    )
    frame = conn.connection_frame
    return conn unless frame && frame.command == 'ERROR'
    message = frame.headers['message'].to_s
    conn.disconnect rescue nil
    raise "CONNECT refused: #{message}" if try == tries || message !~ /already connected|InvalidClientID/i
    sleep 0.1
  end
end

def receive(conn, count, ack)
  count.times do
    message = Timeout.timeout(5) { conn.receive }
    puts "message #{message.body}"
    conn.ack(message.headers['ack']) if ack
  end
rescue Timeout::Error
  puts 'timeout'
end

def nothing_more(conn)
  message = Timeout.timeout(1) { conn.receive }
  puts "unexpected #{message.body}"
rescue Timeout::Error
  puts 'nothing more'
end

def subscribed(conn, destination, headers, id)
  receipt = "sub-#{id}"
  conn.subscribe(destination, headers.merge('receipt' => receipt), id)
  frame = Timeout.timeout(5) { conn.receive }
  raise "expected the RECEIPT of SUBSCRIBE, got #{frame.command}" unless frame.command == 'RECEIPT'
end

case scenario
when 'queue'
  conn = connect_stomp(port)
  %w[one two three].each { |body| conn.publish("/queue/#{name}", body, 'persistent' => 'false') }
  conn.subscribe("/queue/#{name}", { 'ack' => 'client-individual', 'activemq.prefetchSize' => '1' }, 'q')
  receive(conn, 3, true)
  conn.unsubscribe("/queue/#{name}", {}, 'q')
  conn.disconnect
when 'selector'
  conn = connect_stomp(port)
  subscribed(conn, "/topic/#{name}", { 'selector' => "color = 'red' AND size > 2" }, 's')
  conn.publish("/topic/#{name}", 'red-big', 'color' => 'red', 'size' => '5')
  conn.publish("/topic/#{name}", 'blue-big', 'color' => 'blue', 'size' => '5')
  conn.publish("/topic/#{name}", 'red-small', 'color' => 'red', 'size' => '1')
  receive(conn, 1, false)
  nothing_more(conn)
  conn.disconnect
when 'durable'
  durable = { 'activemq.subscriptionName' => 'sub' }
  subscriber = connect_stomp(port, 'client-id' => name)
  subscribed(subscriber, "/topic/#{name}", durable, 'd')
  subscriber.disconnect # the subscription keeps collecting
  publisher = connect_stomp(port)
  %w[away-1 away-2].each { |body| publisher.publish("/topic/#{name}", body) }
  subscriber = connect_stomp(port, 'client-id' => name)
  subscriber.subscribe("/topic/#{name}", durable.merge('ack' => 'client-individual'), 'd')
  receive(subscriber, 2, true)
  subscriber.unsubscribe("/topic/#{name}", {}, 'd')
  subscriber.unsubscribe("/topic/#{name}", durable, 'd')
  subscriber.disconnect
  publisher.disconnect
else
  warn "unknown scenario #{scenario}"
  exit 2
end
puts 'done'
