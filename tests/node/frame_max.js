// Connect with amqplib asking for frameMax=FRAME_MAX (older amqplib releases asked for 4096
// by default) and report what the client sees: "open <frame_max>" after a queue round trip,
// or "refused: <error>" when the broker ends the handshake.
'use strict';
const amqp = require('amqplib');

const [port, frameMax] = process.argv.slice(2);

async function main() {
  let conn;
  try {
    conn = await amqp.connect(`amqp://guest:guest@127.0.0.1:${port}/?frameMax=${frameMax}`);
  } catch (err) {
    console.log(`refused: ${err.message}`);
    return;
  }
  const ch = await conn.createChannel();
  const {queue} = await ch.assertQueue('', {exclusive: true});
  ch.sendToQueue(queue, Buffer.alloc(20000, 1));  // split at the negotiated frame size
  let got = false;
  while (!got) got = await ch.get(queue, {noAck: true});
  console.log(`open ${conn.connection.frameMax} ${got.content.length}`);
  await conn.close();
}

main().catch((err) => { console.error(err); process.exit(1); });
