// MQTT.js over wss:// against a running Sagüin: started by
// broker/doors_mqttjs_test.go, which passes the door's URL and the CA that
// signed its certificate in the environment.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import mqtt from 'mqtt';

const url = process.env.SAGUIN_WSS_URL;
const ca = readFileSync(process.env.SAGUIN_CA);

function connect(clientId) {
  return mqtt.connectAsync(url, { ca, protocolVersion: 5, clientId, clean: true, reconnectPeriod: 0, connectTimeout: 20000 });
}

function nextMessage(client, topic) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no message on ${topic} within 20 s`)), 20000);
    client.on('message', (t, payload, packet) => {
      if (t === topic) {
        clearTimeout(timer);
        resolve({ payload: payload.toString(), packet });
      }
    });
  });
}

test('MQTT.js publishes and subscribes over wss, MQTT 5', async () => {
  assert.ok(url && url.startsWith('wss://'), `SAGUIN_WSS_URL is ${url}`);
  const sub = await connect('mqttjs-sub');
  const pub = await connect('mqttjs-pub');
  try {
    const granted = await sub.subscribeAsync(['events/js', 'status/js'], { qos: 1 });
    assert.deepEqual(granted.map((g) => g.qos), [1, 1]);
    // A channel (append): the delivery carries the broker's record headers.
    const stored = nextMessage(sub, 'events/js');
    await pub.publishAsync('events/js', 'from MQTT.js', { qos: 1 });
    const rec = await stored;
    assert.equal(rec.payload, 'from MQTT.js');
    assert.ok(rec.packet.properties.userProperties['saguin-offset'], 'an append record carries saguin-offset');
    // Broadcast, large enough to span several WebSocket frames and TLS records.
    const big = 'x'.repeat(100000);
    const broadcast = nextMessage(sub, 'status/js');
    await pub.publishAsync('status/js', big, { qos: 1 });
    assert.equal((await broadcast).payload, big);
  } finally {
    await sub.endAsync();
    await pub.endAsync();
  }
});
