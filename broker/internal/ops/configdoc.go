package ops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"saguin.dev/broker/config"
)

// Sections are the names /v1/operations/config?section= takes (docs/operations.md "The routes"), in the order the whole document writes them.
var Sections = []string{"bridges", "channels", "limits", "listeners", "operations", "providers", "storage"}

// configDocument is the resolved configuration, rendered once at start
// (docs/operations.md "The routes"): what the loader resolved — every !include read,
// every default filled — not the file as written, so an edit made since
// is not shown. Only paths to credential files are in it, never their
// contents: the configuration holds nothing else.
type configDocument struct {
	whole    []byte
	sections map[string]json.RawMessage
}

// renderConfig builds the document; an error stops the start (a broker
// that cannot say what it runs on does not run).
func renderConfig(cfg *config.Config) (*configDocument, error) {
	parts := map[string]any{
		"bridges":    map[string]any{}, // this build has no bridges
		"channels":   channelsDoc(cfg),
		"limits":     limitsDoc(cfg.Broker.Limits),
		"listeners":  listenersDoc(cfg.Broker),
		"operations": operationsDoc(cfg.Broker.Operations),
		"providers":  providersDoc(cfg),
		"storage":    storageDoc(cfg.Broker),
	}
	d := &configDocument{sections: make(map[string]json.RawMessage, len(parts))}
	for name, v := range parts {
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("rendering the %s section of /v1/operations/config: %w", name, err)
		}
		d.sections[name] = raw
	}
	broker, err := json.Marshal(brokerDoc(cfg.Broker))
	if err != nil {
		return nil, fmt.Errorf("rendering /v1/operations/config: %w", err)
	}
	var buf bytes.Buffer
	buf.WriteString(`{"broker":`)
	buf.Write(broker)
	for _, name := range Sections {
		fmt.Fprintf(&buf, ",%q:", name)
		buf.Write(d.sections[name])
	}
	buf.WriteString("}\n")
	d.whole = buf.Bytes()
	return d, nil
}

// render is the document narrowed to sections (none: the whole of it).
// A section named twice is written once. An unknown name is an error
// listing the valid ones.
func (d *configDocument) render(sections []string) ([]byte, error) {
	if len(sections) == 0 {
		return d.whole, nil
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	seen := map[string]bool{}
	for _, s := range sections {
		raw, ok := d.sections[s]
		if !ok {
			return nil, fmt.Errorf("unknown section %q; the sections are %s", cutString(s, 64), strings.Join(Sections, ", "))
		}
		if seen[s] {
			continue
		}
		if len(seen) > 0 {
			buf.WriteByte(',')
		}
		seen[s] = true
		fmt.Fprintf(&buf, "%q:", s)
		buf.Write(raw)
	}
	buf.WriteString("}\n")
	return buf.Bytes(), nil
}

// The values are written as the configuration file writes them: sizes and
// durations in their units ("64MiB", "90m"), "none" where the key's zero
// means no bound, a path as a string and an absent one as null.

func duration(d time.Duration) string { return config.FormatDuration(d) }

// Seconds writes a duration held in whole seconds as the key is written:
// min_scrape_interval is "60s", not "1m".
func Seconds(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) + "s" }

// orNone is d, or "none" when zero means no bound.
func orNone(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return duration(d)
}

func bytesOrNone(n int64) string {
	if n == 0 {
		return "none"
	}
	return config.FormatBytes(n)
}

func countOrNone(n int) any {
	if n == 0 {
		return "none"
	}
	return n
}

func path(p string) *string {
	if p == "" {
		return nil
	}
	return &p
}

func brokerDoc(b config.Broker) map[string]any {
	return map[string]any{
		"id":        b.ID,
		"log_level": b.LogLevel,
		"pid_file":  path(b.PIDFile),
		"qos2": map[string]any{
			"max_inflight_per_client": b.QoS2.MaxInflightPerClient,
			"expires_after":           duration(b.QoS2.ExpiresAfter),
		},
		"share": map[string]any{"expires_after": orNone(b.Share.ExpiresAfter)},
	}
}

func channelsDoc(cfg *config.Config) map[string]any {
	out := make(map[string]any, len(cfg.Channels))
	for _, c := range cfg.Channels {
		ch := map[string]any{
			"type":          c.Type,
			"filter":        c.FilterAsWritten,
			"filters":       c.Filters,
			"storage":       c.Storage,
			"configured_in": c.File,
		}
		switch {
		case c.Type == "append":
			ch["retention_period"] = orNone(c.RetentionPeriod)
			ch["retention_bytes"] = bytesOrNone(c.RetentionBytes)
			if c.DeadLetterOf != "" {
				// Its queue's: no bound or start of its own.
				ch["dead_letter_of"] = c.DeadLetterOf
				break
			}
			ch["max_bytes"] = bytesOrNone(c.MaxBytes)
			ch["start"] = "floor"
			if c.StartTail {
				ch["start"] = "tail"
			}
		case c.Type == "latest":
			ch["retention_period"] = orNone(c.RetentionPeriod)
			ch["deletion_retention_period"] = orNone(c.DeletionRetentionPeriod)
		case c.Type == "queue":
			ch["max_bytes"] = bytesOrNone(c.MaxBytes)
			ch["visibility_timeout"] = duration(c.VisibilityTimeout)
			ch["job_expires_after"] = orNone(c.JobExpiresAfter)
			retry := map[string]any{"max_attempts": c.MaxAttempts, "backoff": c.Backoff}
			if c.Backoff != "none" {
				retry["backoff_base"] = duration(c.BackoffBase)
			}
			ch["retry"] = retry
			ch["dead_letter"] = c.DeadLetter
		}
		out[c.Name] = ch
	}
	return out
}

func limitsDoc(l config.Limits) map[string]any {
	return map[string]any{
		"max_message_size":     config.FormatBytes(l.MaxMessageSize),
		"max_topic_length":     l.MaxTopicLength,
		"max_topic_levels":     l.MaxTopicLevels,
		"max_client_id_length": l.MaxClientIDLength,
		"max_header_count":     l.MaxHeaderCount,
		"max_header_bytes":     config.FormatBytes(l.MaxHeaderBytes),
		"max_connections":      l.MaxConnections,
		"max_subscriptions":    l.MaxSubscriptions,
		"max_session_expiry":   duration(l.MaxSessionExpiry),
		"max_keepalive":        orNone(l.MaxKeepalive),
		"publish_rate":         countOrNone(l.PublishRate),
		"publish_bytes":        bytesOrNone(l.PublishBytes),
		"write_timeout":        orNone(l.WriteTimeout),
		"connect_timeout":      duration(l.ConnectTimeout),
		"max_connect_size":     config.FormatBytes(l.MaxConnectSize),
		"max_connect_rate":     countOrNone(l.MaxConnectRate),
		"session_queue_bytes":  config.FormatBytes(l.SessionQueueBytes),
	}
}

func listenersDoc(b config.Broker) map[string]any {
	version := "3.1.1"
	if b.MinProtocolVersion == 5 {
		version = "5"
	}
	return map[string]any{
		"password_file":        path(b.PasswordFile),
		"acl_file":             path(b.ACLFile),
		"min_protocol_version": version,
		"doors":                doorsDoc(b.Listeners, false),
	}
}

func operationsDoc(o *config.Operations) map[string]any {
	if o == nil {
		return map[string]any{} // docs/operations.md "The routes": an unused section is an empty object
	}
	return map[string]any{
		"password_file":       path(o.PasswordFile),
		"min_scrape_interval": Seconds(o.MinScrapeInterval),
		"doors":               doorsDoc(o.Listeners, true),
	}
}

// doorsDoc is each door by its id, with what it resolved to: its
// effective password file, whether it admits anonymous clients (MQTT
// doors only), its TLS files.
func doorsDoc(ls []config.Listener, ops bool) map[string]any {
	out := make(map[string]any, len(ls))
	for _, l := range ls {
		d := map[string]any{"name": l.Name, "kind": l.Kind, "password_file": path(l.PasswordFile)}
		switch l.Kind {
		case "unix":
			d["path"] = l.Path
			d["mode"] = fmt.Sprintf("%04o", l.Mode&fs.ModePerm)
			d["proxy_protocol"] = l.ProxyProtocol
		default:
			d["address"] = l.Address
			d["tls"] = tlsDoc(l.TLS)
		}
		if l.Kind == "ws" {
			d["same_origin"] = l.SameOrigin
			d["allowed_origins"] = nonNilStrings(l.AllowedOrigins)
		}
		if !ops {
			d["allow_anonymous"] = l.AllowAnonymous
		}
		if l.File != "" {
			d["configured_in"] = l.File
		}
		out[l.ID] = d
	}
	return out
}

func tlsDoc(t *config.TLS) any {
	if t == nil {
		return nil
	}
	version := "1.2"
	if t.MinVersion == 0x0304 { // tls.VersionTLS13
		version = "1.3"
	}
	return map[string]any{
		"cert_file":           t.CertFile,
		"key_file":            t.KeyFile,
		"client_ca_file":      path(t.ClientCAFile),
		"require_certificate": t.ClientCAFile != "" && t.RequireCertificate,
		"min_version":         version,
	}
}

func providersDoc(cfg *config.Config) map[string]any {
	out := make(map[string]any, len(cfg.Providers))
	for name, p := range cfg.Providers {
		d := map[string]any{"type": p.Type, "max_bytes": bytesOrNone(p.MaxBytes)}
		switch p.Type {
		case "memory":
			d["snapshot_dir"] = "none"
			if p.SnapshotDir != "" {
				d["snapshot_dir"] = p.SnapshotDir
			}
		case "sqlite":
			d["file_path"] = p.FilePath
			d["flush_interval"] = duration(p.FlushInterval)
			d["read_connections"] = p.ReadConnections
			switch {
			case p.PublishCommitNone:
				d["publish_commit_interval"] = "none"
			case p.PublishCommitInterval > 0:
				d["publish_commit_interval"] = duration(p.PublishCommitInterval)
				d["publish_commit_max_records"] = p.PublishCommitMaxRecords
			default:
				d["publish_commit_interval"] = nil // collect without waiting
			}
		}
		if p.File != "" {
			d["configured_in"] = p.File
		}
		out[name] = d
	}
	return out
}

func storageDoc(b config.Broker) map[string]any {
	return map[string]any{
		"default":                  b.DefaultProvider,
		"default_retention_period": orNone(b.DefaultRetentionPeriod),
		"default_retention_bytes":  bytesOrNone(b.DefaultRetentionBytes),
		"retained": map[string]any{
			"storage":          b.Retained.Storage,
			"retention_period": orNone(b.Retained.RetentionPeriod),
		},
		"session": map[string]any{
			"storage":             b.Session.Storage,
			"ack_commit_interval": duration(b.Session.AckCommitInterval),
		},
	}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
