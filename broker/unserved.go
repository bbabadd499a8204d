package broker

import (
	"saguin.dev/broker/config"
)

// Unserved lists, as findings placed where each key is written, what a
// configuration asks for that this build cannot keep: the operations
// listener is read and checked by the configuration loader (RFC 0002) but
// not yet served by the broker. Starting anyway would leave a door
// unopened — silently; the broker never acknowledges a promise it cannot
// keep, its configuration included.
//
// It is a config.Check: --check-config and the start run it in the
// loader's own pass, so these findings come with the others, in the same
// format (file:line: key "value": fix). New runs it again, for callers
// that load without it.
func Unserved(cfg *config.Config) []config.Finding {
	var out []config.Finding
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
