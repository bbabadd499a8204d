package wire

import (
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The CONNECTs the fuzz target opens with: issue 12's ordinary MQTT 5 one
// (Clean Start, keep-alive 60, client id "zzz") and its MQTT 3.1.1 twin.
var (
	fuzzConnect5   = unhex("10 10 00 04 4d 51 54 54 05 02 00 3c 00 00 03 7a 7a 7a")
	fuzzConnect311 = unhex("10 0f 00 04 4d 51 54 54 04 02 00 3c 00 03 7a 7a 7a")
)

func unhex(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

// fuzzServer is a substrate configured as the broker's newServer
// configures it where decoding depends on it (inbound Topic Alias Maximum, no packet-size check
// of its own beyond the framer's limit).
func fuzzServer() *mqtt.Server {
	caps := mqtt.NewDefaultServerCapabilities()
	caps.TopicAliasMaximum = TopicAliasMaximum
	caps.MaximumClientWritesPending = 16
	caps.MaximumPacketSize = 1 << 16
	return mqtt.New(&mqtt.Options{Capabilities: caps, Logger: slog.New(slog.DiscardHandler),
		ClientNetReadBufferSize: 4096, ClientNetWriteBufferSize: 4096})
}

// FuzzInboundAfterConnect feeds arbitrary bytes after a valid CONNECT
// through the real inbound path, in process: a Framer (the socket
// delivering them chunk bytes at a time), then the substrate's
// own reader — Client.ReadFixedHeader and Client.ReadPacket, the calls its
// read loop makes — and the checks its processPacket runs before acting on
// a packet. Any panic fails (issue 12 item 0b); so does a packet the framer
// handed on that the substrate could not decode, since the substrate ends
// such a connection without the answer MQTT 5 is owed.
func FuzzInboundAfterConnect(f *testing.F) {
	srv := fuzzServer()
	for _, seed := range []struct {
		v311  bool
		chunk uint8
		data  string
	}{
		{false, 255, "82 06 00 01 00 00 01 61"},             // issue 12: the options byte missing
		{false, 255, "82 0a 00 01 00 00 01 61 01 00 01 62"}, // issue 12: the second filter's missing
		{false, 0, "82 06 00 01 00 00 01 61"},
		{true, 255, "82 04 00 01 00 01"},
		{false, 3, "30 0a 00 03 61 2f 62 00 68 65 6c 6f"},
		{false, 255, "32 0b 00 00 00 01 03 23 00 05 78 79 7a"},
		{false, 255, "82 09 00 02 02 0b 00 00 01 61 00"},
		{false, 255, "e0 01 04"},
		{false, 255, "c0 00 c0 01 00"},
		{false, 255, "40 04 00 01 10 00 62 05 00 01 00 00 00"},
		{true, 7, "30 05 00 01 61 68 69 e0 00"},
		{false, 255, "a2 06 00 03 00 00 01 61 f0 00"},
		{false, 255, "30 80 80 80 80 01"},
	} {
		f.Add(seed.v311, seed.chunk, unhex(seed.data))
	}
	f.Fuzz(func(t *testing.T, v311 bool, chunk uint8, data []byte) {
		connect := fuzzConnect5
		if v311 {
			connect = fuzzConnect311
		}
		stream := append(append([]byte{}, connect...), data...)
		cl := srv.NewClient(newScript(1<<16, 1<<16, stream, int(chunk)+1), "fuzz", "", false)
		fh := new(packets.FixedHeader)
		if err := cl.ReadFixedHeader(fh); err != nil {
			t.Fatalf("the CONNECT's fixed header: %v", err)
		}
		pk, err := cl.ReadPacket(fh)
		if err != nil {
			t.Fatalf("the CONNECT: %v", err)
		}
		cl.ParseConnect("fuzz", pk)
		if code := pk.ConnectValidate(); code != packets.CodeSuccess {
			t.Fatalf("the CONNECT refused by the substrate: %v", code)
		}
		for {
			fh := new(packets.FixedHeader)
			if err := cl.ReadFixedHeader(fh); err != nil {
				endedAsRefused(t, err)
				return
			}
			pk, err := cl.ReadPacket(fh)
			if err != nil {
				endedAsRefused(t, err)
				return
			}
			// What processPacket checks before it acts on a packet.
			switch pk.FixedHeader.Type {
			case packets.Publish:
				pk.PublishValidate(TopicAliasMaximum)
			case packets.Subscribe:
				pk.SubscribeValidate()
			case packets.Unsubscribe:
				pk.UnsubscribeValidate()
			case packets.Auth:
				t.Fatal("the framer handed on an AUTH packet")
			}
		}
	})
}

// endedAsRefused accepts the ends a fuzzed stream may have: the bytes ran
// out (mid-packet or not), or the framer refused a packet. Anything else is
// the substrate refusing what the framer let through.
func endedAsRefused(t *testing.T, err error) {
	t.Helper()
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, errRefusedHere):
		return
	}
	t.Fatalf("the substrate could not read a packet the framer handed on: %v", err)
}

// FuzzInboundConnect is FuzzInboundAfterConnect for the first packet: any
// bytes as the CONNECT, through the framer and then the substrate's reader
// and its CONNECT checks (ParseConnect, ConnectValidate). A CONNECT the
// framer handed on must decode; what follows it is read as in
// FuzzInboundAfterConnect.
func FuzzInboundConnect(f *testing.F) {
	srv := fuzzServer()
	for _, seed := range []string{
		"10 10 00 04 4d 51 54 54 05 02 00 3c 00 00 03 7a 7a 7a",
		"10 0f 00 04 4d 51 54 54 04 02 00 3c 00 03 7a 7a 7a",
		"10 11 00 04 4d 51 54 54 05 02 00 3c 00 00 03 7a 7a 7a 00",                   // trailing byte
		"10 10 00 04 4d 51 54 54 05 0a 00 3c 00 00 03 7a 7a 7a",                      // Will QoS without Will
		"10 16 00 04 4d 51 54 54 05 02 00 3c 06 21 00 00 21 00 01 00 03 7a 7a 7a",    // Receive Maximum 0, twice
		"10 17 00 04 4d 51 54 54 05 02 00 3c 05 15 00 02 61 62 00 03 7a 7a 7a 00 00", // Authentication Method
		"10 1c 00 04 4d 51 54 54 05 c6 00 3c 00 00 01 61 00 00 01 62 00 01 63 00 01 64 00 01 65",
		"10 10 00 04 4d 51 54 54 06 02 00 3c 00 00 03 7a 7a 7a",
		"10 0c 00 06 4d 51 49 73 64 70 03 02 00 3c 00 00",
	} {
		f.Add(uint8(255), unhex(seed))
	}
	f.Fuzz(func(t *testing.T, chunk uint8, data []byte) {
		cl := srv.NewClient(newScript(1<<16, 1<<16, data, int(chunk)+1), "fuzz", "", false)
		fh := new(packets.FixedHeader)
		if err := cl.ReadFixedHeader(fh); err != nil {
			endedAsRefused(t, err)
			return
		}
		pk, err := cl.ReadPacket(fh)
		if err != nil {
			endedAsRefused(t, err)
			return
		}
		if fh.Type != packets.Connect {
			t.Fatalf("the framer handed on a first packet of type %d", fh.Type)
		}
		cl.ParseConnect("fuzz", pk)
		pk.ConnectValidate()
		for {
			fh := new(packets.FixedHeader)
			if err := cl.ReadFixedHeader(fh); err != nil {
				endedAsRefused(t, err)
				return
			}
			if _, err := cl.ReadPacket(fh); err != nil {
				endedAsRefused(t, err)
				return
			}
		}
	})
}
