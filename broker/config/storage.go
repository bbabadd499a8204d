package config

import (
	"math"
	"os"
	"slices"
	"strconv"
	"time"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Storage constants (docs/configuration.md "`broker.storage`", rfcs/storage-sqlite.md and rfcs/storage-memory.md).
const (
	// SQLiteEmptyBytes is an empty sqlite database: 22 pages of 4KiB.
	SQLiteEmptyBytes         = 88 << 10
	DefaultFlushInterval     = 150 * time.Millisecond
	DefaultReadConnections   = 2
	maxReadConnections       = 8
	maxPublishCommitInterval = time.Second
)

var (
	sqliteKeys = []string{"type", "file_path", "max_bytes", "publish_commit_interval", "publish_commit_max_records", "read_connections", "flush_interval"}
	memoryKeys = []string{"type", "snapshot_dir", "max_bytes"}
)

// storage reads broker.storage (docs/configuration.md "`broker.storage`").
func (l *loader) storage(v val, present bool, p *parsed, parent *mapping) {
	if !present {
		parent.missing("storage", "write a broker.storage block: default, default_retention_period, default_retention_bytes and at least one provider")
		return
	}
	m, ok := l.mapOf(v)
	if !ok {
		return
	}
	p.storageOK = true
	if pv, has := m.get("providers"); has {
		before := len(l.findings)
		gs := l.groups(pv, "provider")
		for _, g := range gs {
			l.provider(g, p)
		}
		if len(gs) == 0 && len(l.findings) == before {
			l.add(pv, "names no provider; define at least one, like main: {type: sqlite, file_path: /var/lib/saguin/main.db}")
		}
	} else {
		m.missing("providers", "define at least one provider, like providers: {main: {type: sqlite, file_path: /var/lib/saguin/main.db}}")
	}
	if dv, has := m.get("default"); has {
		if s, good := l.providerRef(dv, p); good {
			p.DefaultProvider = s
		} else {
			p.storageOK = false
		}
	} else {
		m.missing("default", "name the provider channels use when they name none")
		p.storageOK = false
	}
	if dv, has := m.get("default_retention_period"); has {
		d, none, good := l.duration(dv, durKey{none: true, zeroFix: zeroRetention})
		if good && !none {
			p.DefaultRetentionPeriod = d
		}
		if !good {
			p.storageOK = false
		}
	} else {
		m.missing("default_retention_period", "write a duration like 7d, or none to keep records until a size bound removes them")
		p.storageOK = false
	}
	if dv, has := m.get("default_retention_bytes"); has {
		n, none, good := l.size(dv, sizeKey{none: true, zeroFix: zeroRetention})
		if good && !none {
			p.DefaultRetentionBytes = n
		}
		if !good {
			p.storageOK = false
		}
	} else {
		m.missing("default_retention_bytes", "write a size like 1GiB, or none to keep records until their age removes them")
		p.storageOK = false
	}
	m.finish("default", "default_retention_period", "default_retention_bytes", "providers")
	l.checkProviderPaths(p)
}

func (l *loader) provider(g group, p *parsed) {
	key := "broker.storage.providers." + g.name
	v := g.v
	v.key = key
	if prob := nameProblem(g.name, 128); prob != "" {
		l.addKey(v.file, g.keyLine, key, "provider name %q: %s", g.name, prob)
	}
	if prev, dup := p.providers[g.name]; dup {
		l.addKey(v.file, g.keyLine, key, "provider %q is defined twice: %s and %s; keep one", g.name, where(prev.File, prev.Line), where(v.file, g.keyLine))
		return
	}
	m, ok := l.mapOf(v)
	if !ok {
		return
	}
	pr := Provider{Name: g.name, File: v.file, Line: g.keyLine}
	// Register the name before the checks so channels naming it do not also
	// report an unknown provider.
	defer func() {
		p.providers[g.name] = pr
		p.providerOrder = append(p.providerOrder, g.name)
	}()
	tv, has := m.get("type")
	if !has {
		m.missing("type", "write type: sqlite (a database file, survives a crash) or type: memory (survives a graceful shutdown through a snapshot)")
		m.finish(slices.Concat(sqliteKeys, []string{"snapshot_dir"})...)
		return
	}
	typ, good := l.enum(tv, []string{"sqlite", "memory"}, "sqlite keeps a database file; memory keeps RAM with a snapshot at shutdown")
	if !good {
		m.finish(slices.Concat(sqliteKeys, []string{"snapshot_dir"})...)
		return
	}
	pr.Type = typ

	if mv, has := m.get("max_bytes"); has {
		n, none, good := l.size(mv, sizeKey{none: true, zeroFix: "a provider bounded at zero holds nothing; write a size like 64MiB, or omit the key for no bound"})
		if good && !none {
			pr.MaxBytes = n
			l.checkReserve(mv, typ, n, p)
			if typ == "memory" {
				p.memoryBounds = append(p.memoryBounds, memoryBound{provider: g.name, bytes: n, at: mv})
			}
		}
	}
	for _, k := range []string{"commit_interval", "commit_max_records"} {
		m.refuse(k, "renamed to publish_%s", k)
	}
	if typ == "memory" {
		if sv, has := m.get("snapshot_dir"); has {
			if s, ok := sv.scalarText(); ok && s == "none" {
				pr.SnapshotDir = ""
			} else if s, ok := l.absPath(sv, "the snapshot directory, or none"); ok {
				pr.SnapshotDir = s
				if fi, err := os.Stat(s); err == nil && !fi.IsDir() {
					l.add(sv, "exists and is not a directory; snapshot_dir names a directory")
				}
			}
		} else {
			m.missing("snapshot_dir", "write an absolute directory for the shutdown snapshot, or snapshot_dir: none to keep nothing across a restart")
		}
		for _, k := range sqliteKeys[1:] {
			if k == "max_bytes" {
				continue
			}
			m.refuse(k, "%s is a sqlite key; a memory provider takes snapshot_dir and max_bytes only", k)
		}
		m.finish(memoryKeys...)
		return
	}

	// sqlite
	pr.FlushInterval, pr.ReadConnections = DefaultFlushInterval, DefaultReadConnections
	m.refuse("snapshot_dir", "snapshot_dir is a memory key; a sqlite provider writes its file_path continuously")
	if fv, has := m.get("file_path"); has {
		if s, ok := l.absPath(fv, "the sqlite database file"); ok {
			pr.FilePath = s
			if fi, err := os.Stat(s); err == nil && fi.IsDir() {
				l.add(fv, "is a directory; file_path names the database file itself, like %s/saguin.db", s)
			}
		}
	} else {
		m.missing("file_path", "write the absolute path of the database file, like /var/lib/saguin/main.db")
	}
	if fv, has := m.get("flush_interval"); has {
		d, _, good := l.duration(fv, durKey{
			subSecond: true,
			noneFix:   "the write-ahead log is always synced on a cadence; write a duration from 10ms to 1s (default 150ms)",
			zeroFix:   "it is from 10ms to 1s (default 150ms)",
			min:       10 * time.Millisecond, max: time.Second,
			rangeFix: "it is from 10ms to 1s (default 150ms)",
		})
		if good {
			pr.FlushInterval = d
		}
	}
	if rv, has := m.get("read_connections"); has {
		if n, good := l.integer(rv, 0, maxReadConnections, "it is from 0 to 8 (0 reads on the write connection; default 2)"); good {
			pr.ReadConnections = int(n)
		}
	}
	intervalSet := false
	if iv, has := m.get("publish_commit_interval"); has {
		d, none, good := l.duration(iv, durKey{
			none:      true,
			subSecond: true,
			zeroFix:   "write a duration from 1ms to 1s, none for a transaction per publish, or omit the key to collect without waiting",
			min:       time.Millisecond, max: maxPublishCommitInterval,
			rangeFix: "it is from 1ms to 1s (or none); single-digit milliseconds are the useful range",
		})
		if good {
			pr.PublishCommitInterval, pr.PublishCommitNone = d, none
			// Decided (open point): none is one transaction per publish,
			// so it collects nothing and takes no record count.
			intervalSet = !none
		}
	}
	if rv, has := m.get("publish_commit_max_records"); has {
		hi := int64(math.MaxInt32)
		if p.limitsOK.connections {
			hi = int64(p.Limits.MaxConnections)
		}
		switch {
		case !m.has("publish_commit_interval"):
			l.add(rv, "it only closes a batch that publish_commit_interval collects; set publish_commit_interval too, or remove this key")
		case pr.PublishCommitNone:
			l.add(rv, "publish_commit_interval is none (a transaction per publish), which collects no batch to count; remove this key")
		default:
			if n, good := l.integer(rv, 2, hi, "it is from 2 to broker.limits.max_connections ("+itoa(hi)+")"); good {
				pr.PublishCommitMaxRecords = int(n)
			}
		}
	} else if intervalSet {
		m.missing("publish_commit_max_records", "with publish_commit_interval set, write how many records close a batch early (2 to broker.limits.max_connections)")
	}
	m.finish(sqliteKeys...)
}

// checkReserve applies the reserve rule (docs/configuration.md "`broker.storage`"): a provider must hold at
// least twice the largest record, so that when it is full an ack, a
// dead-letter move or a QoS 2 release still has room.
func (l *loader) checkReserve(v val, typ string, n int64, p *parsed) {
	if !p.limitsOK.messageSize || !p.limitsOK.headerBytes {
		return
	}
	reserve := p.Limits.Reserve()
	need := 2 * reserve
	extra := ""
	if typ == "sqlite" {
		need += SQLiteEmptyBytes
		extra = " plus " + FormatBytes(SQLiteEmptyBytes) + " for an empty sqlite database"
	}
	if (typ == "sqlite" && n > need) || (typ != "sqlite" && n >= need) {
		return
	}
	op := "at least"
	if typ == "sqlite" {
		op = "more than"
	}
	l.add(v, "it must be %s %s: twice the reserve of broker.limits.max_message_size (%s) + broker.limits.max_header_bytes (%s)%s, so an ack or a dead-letter move still fits when the provider is full; raise max_bytes, or lower max_message_size (the larger share)",
		op, FormatBytes(need), FormatBytes(p.Limits.MaxMessageSize), FormatBytes(p.Limits.MaxHeaderBytes), extra)
}

// checkProviderPaths refuses two providers on one file or directory.
func (l *loader) checkProviderPaths(p *parsed) {
	seen := map[string]Provider{}
	for _, name := range p.providerOrder {
		pr := p.providers[name]
		path := pr.FilePath
		if pr.Type == "memory" {
			path = pr.SnapshotDir
		}
		if path == "" {
			continue
		}
		if prev, dup := seen[path]; dup {
			l.addKey(pr.File, pr.Line, "broker.storage.providers."+name,
				"uses %s, which provider %s (%s) uses too; two providers never share a file or directory", path, prev.Name, where(prev.File, prev.Line))
			continue
		}
		seen[path] = pr
	}
}
