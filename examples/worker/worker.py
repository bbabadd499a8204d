#!/usr/bin/env python3
"""A Sagüin queue worker on Eclipse Paho (paho-mqtt 1.6, MQTT 5).

    python3 worker.py [--host 127.0.0.1] [--port 1883] [--queue jobs] [--id ID] [--max N]

It subscribes to the queue form $saguin/queue/<queue> at QoS 1, does each
job it is given and answers it from the same session: a publish to the
delivery's Response Topic carrying the delivery's Correlation Data and the
payload "ack" (done: the job leaves the queue) or "return" (failed: offered
again, until its attempts are spent). An answer from any other session is
ignored by the broker (docs/channels.md "Queue"), which is why the answer
is sent here, from the message handler, and not by another program.

Needs only the standard library and Debian's python3-paho-mqtt.
"""
import argparse
import os
import sys

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def user_property(props, name):
    for key, value in getattr(props, "UserProperty", None) or []:
        if key == name:
            return value
    return ""


def process(job):
    """The example's work: print the job. Return False to hand it back."""
    print("job %s %s (saguin-id %s, offset %s)" % (
        job.topic, job.payload.decode("utf-8", "replace"),
        user_property(job.properties, "saguin-id"),
        user_property(job.properties, "saguin-offset")), flush=True)
    return True


def main():
    ap = argparse.ArgumentParser(description="Consume a Sagüin queue and answer every job.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--queue", default="jobs")
    ap.add_argument("--id", default="worker-py-%d" % os.getpid())
    ap.add_argument("--max", type=int, default=0,
                    help="stop after this many answers are acknowledged (0: run until interrupted)")
    args = ap.parse_args()

    state = {"answered": 0, "failed": None}
    answers = {}  # mid of an answer -> the line to print once the broker has it

    def on_connect(client, userdata, flags, reason, properties):
        if reason.value != 0:
            state["failed"] = "connect refused: %s" % reason
            client.disconnect()
            return
        client.subscribe("$saguin/queue/" + args.queue, qos=1)

    def on_subscribe(client, userdata, mid, reasons, properties):
        # Granted QoS 1, or a refusal: 0x8F no such queue, 0x83 QoS 0.
        code = reasons[0].value
        if code != 1:
            state["failed"] = "subscribe $saguin/queue/%s: reason code 0x%02x" % (args.queue, code)
            client.disconnect()

    def on_message(client, userdata, job):
        # Paho sends the PUBACK for this delivery after this handler
        # returns, so the answer goes out first; the broker counts the
        # attempt at whichever of the two it sees first.
        props = job.properties
        response_topic = getattr(props, "ResponseTopic", "")
        correlation = getattr(props, "CorrelationData", b"")
        if not response_topic or not correlation:
            return  # not a queue delivery: nothing to answer
        verdict = "ack" if process(job) else "return"
        answer = Properties(PacketTypes.PUBLISH)
        answer.CorrelationData = correlation  # the Delivery ID, echoed unchanged
        info = client.publish(response_topic, verdict, qos=1, properties=answer)
        answers[info.mid] = "%s %s attempt %s" % (verdict, job.topic, user_property(props, "saguin-attempt"))

    def on_publish(client, userdata, mid):
        # The broker's PUBACK for an answer: it received it. It never says
        # whether the answer was applied (a late one is logged and ignored).
        line = answers.pop(mid, None)
        if line is None:
            return
        state["answered"] += 1
        print(line, flush=True)
        if args.max and state["answered"] >= args.max:
            client.disconnect()

    if hasattr(mqtt, "CallbackAPIVersion"):
        # paho-mqtt 2.x asks which callback signatures the program uses:
        # VERSION1 are the 1.x ones written above.
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION1, client_id=args.id, protocol=mqtt.MQTTv5)
    else:
        client = mqtt.Client(client_id=args.id, protocol=mqtt.MQTTv5)
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.on_publish = on_publish
    # Clean Start and no Session Expiry: the session ends with the
    # connection, so a job held when the worker stops is handed back at once.
    client.connect(args.host, args.port, keepalive=30, clean_start=True)
    try:
        client.loop_forever()
    except KeyboardInterrupt:
        client.disconnect()
    print("answered %d job(s)" % state["answered"], flush=True)
    if state["failed"]:
        print("worker.py: " + state["failed"], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
