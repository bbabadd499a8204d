package broker

import (
	"bytes"

	"github.com/mochi-mqtt/server/v2/packets"
)

// encodeDelivery appends one PUBLISH of Sagüin's own to buf, as every pump
// writes them (channel records, latest values, broadcast): at the client's
// protocol level, with the publisher's Response Topic and Correlation Data
// (the substrate's encoder drops both unless told it may — docs/channels.md "From
// publish to record"), and refused with ErrPacketTooLarge past the
// client's Maximum Packet Size (docs/channels.md "What a delivery carries"), buf then left as it was.
func encodeDelivery(buf *bytes.Buffer, pk *packets.Packet, version byte, maxSize uint32) error {
	pk.ProtocolVersion = version
	pk.Mods.AllowResponseInfo = true
	start := buf.Len()
	err := pk.PublishEncode(buf)
	if err == nil && maxSize > 0 && uint32(buf.Len()-start) > maxSize {
		err = packets.ErrPacketTooLarge
	}
	if err != nil {
		buf.Truncate(start)
	}
	return err
}
