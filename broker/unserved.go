package broker

import (
	"saguin.dev/broker/config"
)

// Unserved lists, as findings placed where each key is written, what a
// configuration asks for that this build cannot keep: client authentication
// (password files), roles (acl_file), TLS on a door, WebSocket doors, the
// PROXY protocol and the operations listener are read and checked by the
// configuration loader (RFC 0002) but not yet served by the broker.
// Starting anyway would admit every client, serve plaintext where TLS was
// asked for, or leave a door unopened — silently; the broker never
// acknowledges a promise it cannot keep, its configuration included.
//
// It is a config.Check: --check-config and the start run it in the
// loader's own pass, so these findings come with the others, in the same
// format (file:line: key "value": fix). New runs it again, for callers
// that load without it.
func Unserved(cfg *config.Config) []config.Finding {
	var out []config.Finding
	add := func(key, what string) {
		out = append(out, cfg.At(key, what+" is not enforced by this build of Sagüin; remove the key (clients would otherwise be admitted without it)"))
	}
	if cfg.Broker.PasswordFile != "" {
		add("broker.mqtt.password_file", "client authentication")
	}
	if cfg.Broker.ACLFile != "" {
		add("broker.mqtt.acl_file", "the roles an ACL grants")
	}
	for _, l := range cfg.Broker.Listeners {
		// Each promise of a door is its own finding: fixing one must not
		// reveal the next only on the following run.
		if l.Kind == "ws" {
			f := cfg.At(l.ID, "WebSocket doors are not served by this build of Sagüin; use a tcp or unix door")
			if f.Line == 0 { // a list entry: its own key is not a key read
				f.File, f.Line = l.File, l.Line
			}
			out = append(out, f)
		}
		if l.TLS != nil {
			add(l.ID+".tls", "TLS")
		}
		if l.PasswordFile != "" && l.PasswordFile != cfg.Broker.PasswordFile {
			add(l.ID+".password_file", "client authentication")
		}
		if l.ProxyProtocol {
			add(l.ID+".proxy_protocol", "the PROXY protocol")
		}
	}
	if cfg.Broker.Operations != nil {
		out = append(out, cfg.At("broker.operations",
			"the operations listener (/health, /metrics, /v1/operations) is not served by this build of Sagüin; remove the block (nothing would listen on it)"))
	}
	return out
}

// unservedConfig is Unserved as the error New returns.
func unservedConfig(cfg *config.Config) error {
	list := Unserved(cfg)
	if len(list) == 0 {
		return nil
	}
	return &config.Findings{Source: cfg.Source, List: list}
}
