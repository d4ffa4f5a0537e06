// A publisher that writes until its socket buffer is full, as amqplib's own callback-API
// tests do: publish to a fresh exclusive queue until sendToQueue returns false, close the
// connection, then do it again on a new connection whose channel has twice that
// high-water mark. amqplib writes connection.close on channel 0 ahead of the publishes
// still queued for channel 1, so the broker reads close while publishes keep coming.
'use strict';
const amqp = require('amqplib/callback_api');

const url = process.argv[2];
const rounds = Number(process.argv[3] || 3);

function fail(err) {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
}

function round(options, count, next) {
  amqp.connect(url, (err, conn) => {
    if (err) return fail(err);
    conn.on('error', fail);
    conn.createChannel(options, (err, ch) => {
      if (err) return fail(err);
      ch.assertQueue('', {exclusive: true}, (err, ok) => {
        if (err) return fail(err);
        const body = Buffer.from('a message of a few dozen bytes, like a random string');
        let sent = 0;
        if (count === undefined) {
          while (ch.sendToQueue(ok.queue, body)) sent++;
        } else {
          for (; sent < count; sent++) {
            if (!ch.sendToQueue(ok.queue, body)) return fail(new Error(`buffer full at ${sent}`));
          }
        }
        conn.close((err) => {
          if (err) return fail(err);
          console.log(`published ${sent}, closed`);
          next(sent);
        });
      });
    });
  });
}

function again(left) {
  if (!left) return console.log('done');
  round({}, undefined, (sent) => round({highWaterMark: sent * 2}, sent * 2, () => again(left - 1)));
}

again(rounds);
