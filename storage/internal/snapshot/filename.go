package snapshot

import "strings"

// ChannelExt ends every channel file's name.
const ChannelExt = ".snapshot"

// FileName is the file a channel's snapshot is written to: the name
// percent-encoded outside [A-Za-z0-9_-], so a dot is always encoded (no
// "." or "..", and no name can look like a temporary file) and '%' itself
// too, which makes the mapping one-to-one (rfcs/storage-memory.md "Files").
func FileName(channel string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(channel) + len(ChannelExt))
	for i := 0; i < len(channel); i++ {
		c := channel[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	b.WriteString(ChannelExt)
	return b.String()
}
