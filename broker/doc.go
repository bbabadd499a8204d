// Package broker is the Sagüin daemon: an MQTT 5 / 3.1.1 broker on the
// mochi-mqtt substrate that adds durable channels. Channel topics are stored
// on a provider before they are acknowledged and delivered by Sagüin's own
// pumps; topics no channel claims are broadcast, fanned out by Sagüin to
// each subscribing session's outbox and written by that connection's own
// sender (fanout.go) — the substrate reads packets and keeps subscriptions,
// and delivers nothing.
//
// The rest of this comment (doc.go) is the package's map: where each packet
// goes, which goroutines run, in which order the locks are taken, and which
// functions keep each of the eighteen invariants. doc_test.go holds it to
// the code: every file it names exists, every function that starts a
// goroutine is in the goroutine table, every mutex is in the lock order,
// and every function marked as keeping an invariant is named under that
// invariant. Functions are named Type.method or by their plain name; files
// are in this directory.
//
// # The shape
//
// The substrate (mochi-mqtt/server v2.7.9) reads and decodes packets, keeps
// the subscription tree and answers what Sagüin leaves to it (CONNACK,
// SUBACK, the PUBACK or PUBREC of a publish answered before its hook
// returns, PINGRESP). Everything else is Sagüin's: the door in front of the
// socket (listen.go, admission.go; the byte-level wire checks in
// broker/internal/wire; its TLS, WebSocket and PROXY layers in doors.go and
// broker/internal/door),
// the session (session.go, session_lifecycle.go, session_state.go —
// the only files that take session.mu or touch its mutable fields; the
// rest reach its state through its methods there; ownership.go,
// sessionstore.go, wills.go), the bridges (bridges.go: each link of the
// bridge module brings records in through the publish path, as a Will
// does), storage of every publish to a channel
// (publish.go, inbound.go, qos2.go, latest.go, retained.go) and every
// delivery to a connection (deliveries.go; the pumps in consumer.go,
// latest_consumer.go — which reach the deliveries through their sink,
// delivery_sink.go —, queue_offer.go; broadcast in fanout.go and
// fanout_send.go; the connection writer in conn_writer.go). hooks.go is
// only the adapter between the two: each substrate event becomes one call
// into the broker. The metric catalogue (broker/internal/metrics) reads
// the broker's numbers through metrics_snapshot.go, one lock at a time
// (each through its type's own view: session.view, queueEngine.figures,
// outbox.queueFigures, channel.view, fanout.counts, gate.view,
// eventCounts.view),
// at most once per min_scrape_interval; the per-packet counters it adds
// are per group of connections (metrics_counters.go), and metrics.go is
// the handler the operations listener mounts.
//
// # Packets
//
// CONNECT. listen.go openListener binds a door; admission.go
// admitListener.Accept takes a connection slot or an overflow place from
// the gate (gate.admit) and wraps the socket in a clientConn — over the
// door's layers when it has any (doors.go Broker.doorLayers: a PROXY
// header, TLS, a WebSocket upgrade, set up at the first read within
// connect_timeout; clientConn.peer is what they learnt). Every byte
// the client sends passes clientConn.Read, where the framer
// (broker/internal/wire Framer) judges each packet by its declared size
// and checks its fixed header and body before the substrate decodes it,
// and hands its verdict to clientConn.Judged: a refusal is answered (the
// framer's Answer) and the connection ends. listener.go door.serve hands the
// socket to the substrate. Then, in hooks.go order: OnConnect calls
// connect.go checkConnect (client identifier; who the client is —
// auth.go authenticate: a certificate's or proxy's verified name, else a
// user name checked against the door's password file, else anonymous where
// the door admits it; a refusal waits out its address's penalty,
// authpenalty.go — and, under an ACL, its client_ids, its Will and the
// features it is denied; keep-alive ceiling);
// OnSessionEstablish calls session_lifecycle.go establishSession, which
// takes the client id's claim (ownership.go claimForConnect) and runs
// claimSession's phases — the old connection's pumps stopped and its
// deliveries taken back (takeFromOldConnection), the position check of
// floor.go passedPositions (endsAtConnect), the Will settled (wills.go
// settleWill), the session ended (endClaimedSession) or given to the
// connection (giveSessionTo), and stored before the CONNACK
// (storeClaimedSession, sessionstore.go storeSession). The CONNACK is
// corrected as it is encoded (OnPacketEncode: ownership.go correctConnack,
// admission.go connackPromises). OnSessionEstablished calls
// sessionEstablished: deliveries.resume resends what was left
// unacknowledged, then consumer.start, latestConsumer.start,
// queueEngine.addWorker and outbox.start serve the new connection.
//
// PUBLISH. OnPacketRead (hooks.go) lets a QoS 2 publish wait for the
// answers owed before it (inbound.settle), answers a repeated QoS 2 publish
// itself (substrate_topics.go answerRepeat) and marks the topic so the
// substrate's own topic filters let it through (markForSubstrate). The
// substrate then calls OnPublish, which unmarks the topic and calls
// publish.go receivePublish. A QoS 0 or 1 publish that inbound.go
// pipelinable admits goes to the connection's pipeline (inbound.publish):
// judged by publish.go admitPublish, submitted to storage in the
// connection's order (channelWrite.submit) and answered by the pipeline's
// goroutine (inbound.run) once stored, its PUBACKs gathered into one write
// (inbound.writeAnswers); the read loop goes on meanwhile. Anything else
// is answered before the hook returns (publish.go publish). admitPublish
// applies the rate and size bounds (ratelimit.go publishBudgets.admit, the
// limits; an ACL entry's own figures) and the ACL (permissions.go
// publishFeatureRefusal, publishACLRefusal: write, or delete on a latest
// channel; the $saguin/ requests ask seek, read or consume) and then routes
// by topic:
//
//   - $saguin/ — reserved.go publishReserved: a point read (pointread.go
//     pointRead), a seek (seek.go seek) or a queue answer
//     (reserved.go queueAnswer → queue.go queueEngine.answer) or an
//     operator's hang-up (hangup.go hangUp: DISCONNECT 0x98 to the client
//     named); anything else refused.
//   - broadcast (no channel claims the topic) — a QoS 2 publish is held
//     until its PUBREL (qos2_broadcast.go holdBroadcast); a retained one is
//     stored first (retained.go retain, ordered with new subscriptions by
//     retained_order.go retainedBroadcast). receivePublish hands it to
//     fanout.go fanOut: logged when the broadcast log is on (bcastlog.go
//     logBroadcast), then queued on each subscribing session's outbox
//     (outbox.enqueue, the senders woken after) and offered to each shared
//     group (share.go shareOut). Each connection's sender (fanout_send.go
//     outbox.run) writes it, the message encoded once per shape and copied
//     with its Packet Identifier patched (fanout_encode.go
//     Broker.encodeBroadcast). The
//     substrate is handed the publish marked ignored and fans out nothing.
//   - append — a record (publish.go recordOf) appended to the channel's
//     log (channelWrite.storeNow or submit), then the pumps are woken
//     (channelWrite.stored: channel.notify, share_channel.go
//     shareChannelRecord). A QoS 2 publish is held (qos2.go holdPublish)
//     and appended at its PUBREL.
//   - latest — stored as the topic's value (latest.go storeLatest; an empty
//     payload is a delete, never pipelined), then latestConsumer pumps
//     are woken.
//   - queue — enqueued (channelWrite.storeNow or submit); the offer loop
//     (queue.go queueEngine.run, queue_offer.go) hands it to a worker.
//
// PUBACK, PUBREC, PUBREL, PUBCOMP from the client about the broker's
// deliveries. Every delivery was reserved in the session's deliveries
// (deliveries.go deliveries.reserve: window room, packet id, ack-table
// entry, the permission function Broker.permit) and written by
// deliveries.write, writeRun or writePacket through conn_writer.go
// clientConn.Write. The client's PUBACK, PUBREC or PUBCOMP reaches
// OnPacketRead, which gives it to deliveries.ack when the connection owns
// its session; the substrate never sees it. ack ends the exchange and tells
// its target (consumerAck.acked — the exchange carries the record's
// offset and era back to consumer.acked —, latestAck.acked, queueAck.acked,
// outboxAck.acked — the outbox's entry, by its own seq, not the packet
// id —, retainedAck.acked), or, for a PUBREC, writes the PUBREL
// (deliveries.writeAck) — except for a logged broadcast, whose PUBREL the
// sender writes once the window saying it is owed is stored
// (outboxAck.pubrecd → outbox.pubrecd, fanout_send.go
// outbox.appendPubrels).
//
// PUBREL from the client about its own QoS 2 publish. OnPacketRead waits
// for the answers owed before it (inbound.settle) and calls qos2.go pubrel:
// a held channel publish is released into its channel (a stored hold,
// storage's Release) and PUBCOMP'd (qos2.go pubcomp); a held broadcast
// publish is fanned out (qos2_broadcast.go releaseBroadcast).
//
// SUBSCRIBE. OnPacketRead waits for the connection's earlier publishes,
// takes the owner's turn (ownership.go ownerTurn) and calls subscribe.go
// subscribe, which reads as its phases (refuseMalformedSubscribe,
// refuseDeniedShare, readSubscribeInstructions, admitFilters,
// withinSubscriptionLimit, storeSubscriptions, declareSlices,
// addSubscriptions, writeSuback, startDeliveries): each filter judged by
// the configuration's routing (route.go
// routing.filterCode, routing.queueFormCode; saguin --route asks the same
// code) and then the ACL (permissions.go subscribeRefusal), the channel
// consumers made (addChannelSubscription, startingPosition; latest.go
// addLatestSubscriptions; queueEngine.addWorker), the session stored, the
// SUBACK written, and then the retained pass: retained.go retainedFor
// under the retained order's write lock, sent by sendRetained through the
// deliveries, before the new consumers start; values past the client's
// Receive Maximum are left to a goroutine of the session's that sends them
// as PUBACKs free room (retained_rest.go).
//
// UNSUBSCRIBE. OnPacketRead refuses one from a connection that no longer
// owns its session (ownership.go owns); the substrate removes the filters
// and OnUnsubscribed calls subscribe.go unsubscribed, which stops the
// consumers no filter reaches any more (session.dropFilters).
//
// PINGREQ. Answered by the substrate; never held behind a commit
// (OnPacketRead does not settle the pipeline for it).
//
// DISCONNECT. OnPacketRead waits for the earlier publishes and calls
// session_lifecycle.go disconnecting: a changed Session Expiry applied, the
// Will withdrawn or kept (wills.go discardWill), the session stored before
// the close (ownership_retry.go storeSessionOrRetry), the pumps stopped.
// A DISCONNECT the broker writes closes the connection once written
// (OnPacketSent).
//
// Connection end and Will. OnDisconnect calls connectionGone: the pipeline
// settled (inbound.go inboundEnded), connectionEnded (the pumps stopped, the
// positions stored, a session that ends with its connection ended by
// endSessionKeeping) and the substrate's registration undone under the id's
// claim (ownership.go teardown). The Will is Sagüin's, not the substrate's
// (wills.go): published at the connection's end (willAtConnectionEnd), at
// the session's end (willAtSessionEnd) or when its delay is over (willLoop,
// fireDueWills), through publishWill, which takes the clients' publish path.
//
// The operations listener (rfcs/operations-listener.md; ops.go, served by
// broker/internal/ops) answers HTTP beside all this and changes nothing:
// /health takes the publish path's locks for a moment (health.go
// publishPathOpen); the /v1/operations/ routes format the views each type
// copies of itself, under its own lock or from its own atomics
// (session.view, consumer.position, queueEngine.jobViews, channel.view;
// ops_views.go), or read the records the refusals
// (refused_record.go, fed by the refusal log's observer noteRefusal) and
// the retention floor's passings (position_record.go, fed by
// positionPassed) keep; the operator password files load with the MQTT
// ones (ops_auth.go).
//
// # Goroutines
//
// Every goroutine the package starts, by the function whose go statement
// starts it. Every one has returned when Broker.Close returns, except the
// substrate's own (its event loop, each client's write loop), which end a
// moment after (goroutines_test.go).
//
//	started in                 runs                             stopped by                          owns
//	Broker.background          flushLoop, sweepLoop, willLoop,  the broker's context (Close          its loop's state; counted in
//	  (Start, restoreSessions,   refusalLoop, queueEngine.run,    cancels it), waited for on b.wg     b.wg
//	  startQoS2, runBridges)     bcastLoop, qos2Loop, a
//	                             bridge's link (bridge.Link.Run:
//	                             autopaho's goroutines and the
//	                             link's inbound goroutine, all
//	                             ended before it returns)
//	pumpRun.goLocked           an append pump (consumer.run),   pumpRun.stop: the owner's stop      the pump's read position and
//	  (consumer.start,           a latest pump                    (session.stopPumps, a takeover,     batch; the sender's place in
//	  latestConsumer.start,      (latestConsumer.run), a          an unsubscribe) or the broker's     the outbox; counted in b.wg
//	  outbox.ensureSender)       broadcast sender (outbox.run)    context
//	session.stopPumps          the stop's pump waiter           returns when the pumps it stops     nothing: it lets stopWriting
//	                                                              have stopped                        cut a blocked write meanwhile
//	queueEngine.handOver       one queue job's PUBLISH write    the write's end: bounded by         the job's delivery until
//	                                                              write_timeout, cut by a stop        queueEngine.written; b.wg
//	                                                              (deliveries.stopWriting)
//	inbound.push               a connection's pipeline          itself, answerLinger after no       the answering of the
//	                             (inbound.run)                    answer is owed (a later publish     connection's publishes in
//	                                                              starts another), or at once when    order; counted in b.wg
//	                                                              inboundEnded wakes it
//	Broker.holdRetained        a retained pass's rest           itself, when all is sent or the     the values waiting for room in
//	                             (retainedRest.run)               connection is no longer served;     the client's Receive Maximum;
//	                                                              session.stopPumps stops it, the     counted in b.wg and in the
//	                                                              broker's context ends it            session's restBytes
//	clientConn.flushed         the writer's background flusher  itself, when nothing is pending     the pending bytes of one
//	                             (clientConn.flushLoop)           or the connection failed;           connection; clientConn.Close
//	                                                              clientConn.Close waits for it       waits for it
//	door.Serve                 one connection (door.serve:      the connection's end; the door's    the connection, for the
//	  (the door's accept loop,   the substrate's handling from    close ends the loop; Close waits    substrate; door.serving
//	  started by the             CONNECT to its end)              on door.serving
//	  substrate's Serve)
//	Broker.stopListenerClients one shutdown DISCONNECT per      the write, or the close past        nothing; Close waits for all
//	                             client, and their waiter          cutGrace (cutConnection)
//	Broker.startOperations     an operations door's accept      Close's stopOperations: the         the door's connections, each at
//	  (through the listener's    loop (net/http's Serve) and      listener's Close closes every       most one request at a time;
//	  Serve, broker/internal/    net/http's goroutine per         door and connection, then waits     the listener waits for every
//	  ops)                       connection                       for the accept loops and every      request being handled
//	                                                              request being handled
//
// The CONNECT claim timer (ownership.go claimForConnect, a time.AfterFunc)
// is stopped with the claim it guards and at Close (idClaims.stopTimeouts).
//
// # Locks
//
// Outer to inner, by rank: a lock may be held while taking one of a
// greater rank, never one of its own rank (two of a row never nest, nor
// two instances of one lock) or of a smaller one.
//
//	1  session.subscribing
//	2  Broker.retainedOrder
//	3  channel.deleteMu
//	4  bcastLog.relief  qos2State.mu
//	5  Broker.mu
//	6  door.mu
//	7  consumer.mu  latestConsumer.mu  queueEngine.mu  shareGroup.mu  clientConn.smu
//	8  outbox.mu
//	9  session.mu  deliveries.mu  fanout.mu  shares.mu  channel.mu  bcastLog.mu
//	   authPenalties.mu  inbound.mu  publishBudgets.mu  gate.mu  admitListener.mu
//	   idClaims.mu  connWriter.mu  encodings.mu
//	10 refusedRecord.mu  lostRecord.mu
//
// What each guards: session.subscribing is held across a SUBSCRIBE, its
// SUBACK and retained pass included; Broker.retainedOrder is write-locked
// by subscribe for the retained pass and read-locked by a retained
// broadcast publish (receivePublish, publishWill, releaseBroadcast) across
// its store and fan-out; channel.deleteMu is a latest delete's
// look-then-store (latest.go storeLatest, qos2.go pubrel); bcastLog.relief
// is making room at a full provider (bcastlog_full.go) and qos2State.mu
// the index of held QoS 2 publishes (qos2.go); Broker.mu is the sessions
// map (fireDueWills takes session.mu under it); door.mu is a door's Close,
// held while it closes the door's connections (admitListener.Close); under
// outbox.mu, outbox.countLocked takes encodings.mu (broadcastMsg.heldLocked),
// a broadcast message's kept encodings (fanout_encode.go, never held while
// encoding); refusedRecord.mu and lostRecord.mu are the operations
// listener's records, taken by a refusal and by a passing from under any
// of the others.
//
// lockorder_test.go holds the code to this table: TestLockOrderFollowsDocMap
// type-checks the package and walks its call graph
// (broker/internal/tools/lockorder). Every function and function literal is
// walked in order with the locks it may hold (held on any path counts);
// static calls are followed into the package's functions, a call through
// an interface into every method of the package's types that implements
// it (an ackTarget's acked), a *sync.Mutex parameter to the lock the
// caller passes (pumpRun.stopUnder), and a function literal or method
// value passed as an argument is taken as run during the call unless the
// callee only starts it in a go statement (pumpRun.goLocked) or is
// time.AfterFunc. It fails naming the function and the call path when a
// lock is taken under one of the same or a greater rank, or when a lock
// the table does not name nests with one it does, and on a function that
// may return holding a lock (its caller's walk would not see it held),
// but for three it names and says why. It does not follow calls through a
// function value kept in a field, nor into other packages (the
// substrate's and the storage providers' locks, below); a TryLock is never
// itself a finding, as it cannot wait. TestLockOrderCatchesAnInversion
// is its negative control: the same walk on testdata/lockorder/inverted,
// where session.mu is held while a callee two calls down takes Broker.mu.
//
// The operations listener never waits for a lock while holding another:
// /health takes Broker.retainedOrder (read) and then Broker.mu, in that
// order, each with TryLock, and lets go at once (health.go); the /v1
// routes take Broker.mu, then each session.mu, then a consumer.mu or
// queueEngine.mu, each let go before the next (ops_views.go).
//
// The substrate's locks. Its client lock (mqtt.Client's embedded RWMutex) is
// taken by its WritePacket around the socket write, so the substrate holds
// it when it calls clientConn.Write, which takes connWriter.mu; connWriter.mu
// takes nothing, so the two never meet in the other order. Its Inflight
// table and its Topics index each take their own lock inside each method.
// Ours that may be held when a substrate method takes one of those:
// session.subscribing (Subscribe; the SUBACK's WritePacket, so that a queue
// worker's first job never overtakes its SUBACK), Broker.retainedOrder read
// (the publish path, a Will's InjectPacket to an in-process client, which
// writes to no socket), channel.deleteMu (a latest delete's PUBCOMP written
// and its Inflight entry cleared, qos2.go pubcomp), qos2State.mu
// (Clients.Get and Inflight.Delete when a held exchange is dropped,
// forgetPubrecLocked). No lock of the delivery path — deliveries.mu,
// outbox.mu, encodings.mu, a pump's — is held into the substrate or across a socket
// write (deliveries.write lets go of its lock before clientConn.Write). The
// substrate calls no hook of ours with its client, Inflight or Topics lock
// held (v2.7.9: WritePacket calls OnPacketEncode before taking the client
// lock).
//
// # Invariants
//
// For each invariant, the functions of this package marked as keeping it
// (a "// invariant N:" comment; make invariants lists them with file and
// line, and the storage modules' sites besides).
//
//  1. caught up vs position deleted (a stored floor): Broker.trim,
//     consumer.prepare, consumer.flush, Broker.passedPositions,
//     Broker.endsAtConnect (claimSession's phase), Broker.startingPosition.
//  2. resolution, retention and eviction are distinct: latestServable,
//     queueEngine.sweepExpired, retainedExpired.
//  3. a superseded delivery cannot resolve anything: queueEngine.answer,
//     queueEngine.newDeliveryIDLocked.
//  4. exactly one consumer holds a queue record: queueEngine.removeWorker,
//     queueEngine.claimLocked, routing.queueFormCode.
//  5. the dead-letter move is atomic: queueEngine.deadLetter,
//     queueEngine.claimLocked (the move itself is storage's DeadLetter).
//  6. transport ack is never application ack: queueAck.acked,
//     queueEngine.answer.
//  7. the visibility deadline never overlaps transport in-flight:
//     queueAck.acked, queueEngine.expireLeases.
//  8. message identity and stream position are distinct: recordOfMsg,
//     publishedMessageID (storage keeps the id across a dead-letter move),
//     bridgeLocal.Store (a record brought over a bridge keeps its id).
//  9. offsets are monotonic and never reused: kept by the storage
//     providers, which assign every offset; this package only reads them.
//  10. the broker is the only enforcement point: asLatestValue,
//     Broker.publishWill, bridgeLocal.Store.
//  11. a wildcard never reaches a queue: routing.insideQueue (route.go,
//     asked by Broker.filterCode), Broker.addChannelSubscription.
//  12. the configuration decides a topic's channel: kept by the config and
//     topic packages (the checked channel set, the resolver's most exact
//     filter); this package uses the one resolver config.Load built when it
//     checked the filters (Broker.openChannels).
//  13. everything that accumulates is bounded: Broker.withLogRoom, the
//     Broker's sessions field, Broker.newServer, pendingMax,
//     deliveries.reserve, inbound.publish, inbound.room,
//     broadcastMsg.heldLocked (kept encodings paid for by held entries),
//     Broker.holdPublish, publishBudgets.admit, Broker.endSessionKeeping,
//     Broker.publishWill, Broker.writeRetained (no more retained values
//     unacknowledged than the Receive Maximum), Broker.holdRetained and
//     session.keepRest (what waits for room bounded by
//     session_queue_bytes), bridgeLocal.Store and linkConfig (a bridge's
//     records take the publish path, and its peer is told our packet
//     size limit), refusedRecord.add and lostRecord.add (the operations listener's records). rfcs/bounds.md
//     tables every accumulator that grows with client input, the key or
//     constant bounding it and what a client gets at the bound;
//     TestInvariant13_AccumulatorTableNamesRealKeys (bounds_test.go) holds
//     its keys and names to the configuration and the code.
//  14. memory durability is exactly the last snapshot: Broker.provider
//     (the snapshot itself is the memory provider's).
//  15. a restart never resurrects a delivery: Broker.openChannels,
//     deliveries.takeBack, deliveries.resume, queueEngine.removeWorker,
//     queueEngine.handOver, Broker.restoreSessions.
//  16. no client can withhold another's acknowledgement:
//     Broker.permit (the ACL asked per delivery, permissions.go),
//     Broker.logBroadcast, pendingMax, clientConn.write, clientConn.writeOut,
//     consumer.prepare, deliveries.write, deliveries.stopWriting,
//     outbox.run, outbox.fill, inbound.publish, latestConsumer.offer.
//  17. only the owning connection changes a session: hook.OnPacketRead,
//     Broker.teardown, Broker.ownerTurn, Broker.holdPublish, Broker.pubrel,
//     the session's cl field, Broker.connectionGone,
//     Broker.connectionEnded, Broker.disconnecting.
//  18. nothing is told before it is stored: outbox.pubrecd,
//     hook.OnPacketRead, inbound.outcome, Broker.correctConnack,
//     Broker.storeSessionOrRetry, Broker.pubrel, Broker.claimSession,
//     Broker.storeClaimedSession, Broker.disconnecting, Broker.subscribe, Broker.willLoop,
//     bridgeLocal.Store (the peer is acknowledged only once stored).
package broker
