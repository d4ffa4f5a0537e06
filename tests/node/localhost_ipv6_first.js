// Connect to amqp://localhost:PORT where "localhost" resolves to ::1 first, as with
// Node.js 17 and later on hosts whose hosts file lists ::1 before 127.0.0.1 (Debian,
// Docker, macOS). Happy eyeballs is off, as in Node.js 17 to 19: only ::1 is tried.
// Prints the address connected to, then round-trips one message.
'use strict';
const amqp = require('amqplib');

const port = process.argv[2];

function localhostIPv6First(hostname, options, callback) {
  const addresses = [{address: '::1', family: 6}, {address: '127.0.0.1', family: 4}];
  if (options && options.all) callback(null, addresses);
  else callback(null, addresses[0].address, addresses[0].family);
}

async function main() {
  const conn = await amqp.connect(`amqp://guest:guest@localhost:${port}`, {
    lookup: localhostIPv6First,
    autoSelectFamily: false,
  });
  console.log(`connected to ${conn.connection.stream.remoteAddress}`);
  const ch = await conn.createChannel();
  const {queue} = await ch.assertQueue('', {exclusive: true});
  ch.sendToQueue(queue, Buffer.from('over IPv6'));
  let got = false;
  while (!got) {
    got = await ch.get(queue, {noAck: true});
  }
  console.log(`got ${got.content.toString()}`);
  await conn.close();
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
