package broker

import (
	"errors"
	"fmt"

	"saguin.dev/broker/config"
)

// Unserved is the start-up refusal below, for --check-config.
func Unserved(cfg *config.Config) error { return unservedConfig(cfg) }

// unservedConfig refuses, before anything opens, a configuration naming a
// promise this build cannot keep: client authentication (password files),
// roles (acl_file), TLS on a door, WebSocket doors and the PROXY protocol
// are read and checked by the configuration loader (RFC 0002) but not yet
// enforced by the broker. Starting anyway would admit every client, serve
// plaintext where TLS was asked for, or leave a door unopened — silently;
// the broker never acknowledges a promise it cannot keep, its configuration
// included. Each finding names the key and the fix.
func unservedConfig(cfg *config.Config) error {
	var errs []error
	add := func(key, what string) {
		errs = append(errs, fmt.Errorf("%s: %s is not enforced by this build of Sagüin; remove the key (clients would otherwise be admitted without it)", key, what))
	}
	if cfg.Broker.PasswordFile != "" {
		add("broker.mqtt.password_file", "client authentication")
	}
	if cfg.Broker.ACLFile != "" {
		add("broker.mqtt.acl_file", "the roles an ACL grants")
	}
	for _, l := range cfg.Broker.Listeners {
		switch {
		case l.Kind == "ws":
			errs = append(errs, fmt.Errorf("%s: WebSocket doors are not served by this build of Sagüin; use a tcp or unix door", l.ID))
		case l.TLS != nil:
			add(l.ID+".tls", "TLS")
		case l.PasswordFile != "" && l.PasswordFile != cfg.Broker.PasswordFile:
			add(l.ID+".password_file", "client authentication")
		case l.ProxyProtocol:
			add(l.ID+".proxy_protocol", "the PROXY protocol")
		}
	}
	return errors.Join(errs...)
}
