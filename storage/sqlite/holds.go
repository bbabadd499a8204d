package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"saguin.dev/storage"
)

// Held QoS 2 publishes (rfcs/qos2-holds.md, rfcs/storage-sqlite.md held_publishes). Every
// write runs on the writer goroutine, so a release reads the channel's next
// offset, inserts there and deletes the hold in one transaction, and the
// in-memory counters move only after it commits (storage/storage.go).

var _ storage.HoldStore = (*Provider)(nil)

const heldColumns = `message_id, topic, timestamp, headers, payload, props, retain, qos, publisher, bridge`

// openChannelOf is the open channel a hold is for (append, queue or value
// store). A queue's dead-letter log takes no publishes, so no holds.
func (p *Provider) openChannelOf(name string) (*channel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.appends[name]; ok {
		for _, q := range p.queues {
			if q.dlq == l {
				return nil, fmt.Errorf("storage %s: %s is the dead-letter channel of %s and takes no held publishes", p.opts.Name, name, q.ch.name)
			}
		}
		return l.ch, nil
	}
	if q, ok := p.queues[name]; ok {
		return q.ch, nil
	}
	if v, ok := p.values[name]; ok {
		return v.ch, nil
	}
	return nil, fmt.Errorf("storage %s: no open channel %s takes held publishes: %w", p.opts.Name, name, storage.ErrNotFound)
}

// Hold inserts the hold row in an ordinary transaction: the provider's
// page ceiling less the reserve refuses it (ErrFull), as does a channel
// (append, queue) already at its own max_bytes.
func (p *Provider) Hold(h storage.Held) error {
	if h.ClientID == "" || h.PacketID == 0 {
		return fmt.Errorf("storage %s: a hold needs a client id and a packet id, got %q and %d", p.opts.Name, h.ClientID, h.PacketID)
	}
	ch, err := p.openChannelOf(h.Channel)
	if err != nil {
		return err
	}
	enc, err := encodeRecord(&h.Record)
	if err != nil {
		return fmt.Errorf("storage %s: hold for %s: %w", p.opts.Name, h.Channel, err)
	}
	err = p.do(func(w *writer) error {
		if bound := ch.maxBytes.Load(); bound > 0 && ch.kind != kindLatest {
			ch.mu.Lock()
			held := ch.bytes
			ch.mu.Unlock()
			if held+enc.size > bound {
				return fmt.Errorf("storage %s: %s %s is at its max_bytes %d: %w", p.opts.Name, ch.kind, ch.name, bound, storage.ErrFull)
			}
		}
		return w.txn(false, func(ctx context.Context) error {
			r := &h.Record
			res, err := w.conn.ExecContext(ctx, `INSERT INTO held_publishes (channel, client, packet_id, held_at, `+heldColumns+`, size)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
				ch.id, h.ClientID, int64(h.PacketID), timeToDB(h.HeldAt), r.MessageID, r.Topic, enc.ts, enc.headers,
				enc.payload, enc.props, r.Retain, int64(r.QoS), r.PublisherID, r.Bridge, enc.size)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return errors.Join(err, fmt.Errorf("hold of client %q packet id %d: %w", h.ClientID, h.PacketID, storage.ErrExists))
			}
			return nil
		})
	})
	return p.wrap("hold a QoS 2 publish for "+h.Channel, err)
}

// Release writes the held record at the channel's next offset and deletes
// the hold in one relief transaction (the reserve: a provider that filled
// after the hold does not refuse it). The channel's own max_bytes may
// (append, queue): ErrFull, and the hold stays.
func (p *Provider) Release(channel, clientID string, packetID uint16) (storage.Record, error) {
	return p.ReleaseAt(channel, clientID, packetID, time.Time{})
}

// ReleaseAt is Release with the written record stamped at (zero: as held).
func (p *Provider) ReleaseAt(name, clientID string, packetID uint16, at time.Time) (storage.Record, error) {
	ch, err := p.openChannelOf(name)
	if err != nil {
		return storage.Record{}, err
	}
	var out storage.Record
	err = p.do(func(w *writer) error {
		ctx := context.Background()
		var s recordScan
		var size int64
		dest := append([]any{&s.offset}, s.recordDest()[1:]...)
		err := w.conn.QueryRowContext(ctx, `SELECT 1, `+heldColumns+`, size FROM held_publishes
			WHERE channel = ? AND client = ? AND packet_id = ?`, ch.id, clientID, int64(packetID)).
			Scan(append(dest, &size)...)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("storage %s: %s: no hold of client %q packet id %d: %w", p.opts.Name, name, clientID, packetID, storage.ErrNotFound)
		}
		if err != nil {
			return err
		}
		rec, err := s.record()
		if err != nil {
			return fmt.Errorf("hold of client %q packet id %d: %w", clientID, packetID, err)
		}
		rec.Offset = 0
		if !at.IsZero() {
			rec.Timestamp = at
		}
		r := &pubReq{ch: ch, rec: rec}
		if r.enc, err = encodeRecord(&rec); err != nil {
			return err
		}
		var old int64
		var replaces bool
		if ch.kind == kindLatest {
			if old, replaces, err = w.storedValueSize(ch, rec.Topic); err != nil {
				return err
			}
		}
		ch.mu.Lock()
		next, bytes, depth := ch.next, ch.bytes, ch.depth
		ch.mu.Unlock()
		if bound := ch.maxBytes.Load(); bound > 0 && ch.kind != kindLatest && bytes+r.enc.size > bound {
			// The hold stays: the client re-sends PUBREL once there is room.
			return fmt.Errorf("storage %s: %s %s is at its max_bytes %d: %w", p.opts.Name, ch.kind, ch.name, bound, storage.ErrFull)
		}
		r.out = rec
		// invariant 1: the offset is taken at the release, never at the hold.
		r.out.Offset = next
		switch {
		case ch.kind == kindQueue:
			depth++
		case ch.kind == kindLatest && !replaces:
			depth++
		}
		// The counters move with the COMMIT (txnPublishing).
		err = w.txnPublishing(true, []*channel{ch}, func(ctx context.Context) error {
			if err := w.insert(ctx, r); err != nil {
				return fmt.Errorf("%s %s offset %d: %w", ch.kind, ch.name, next, err)
			}
			if f := p.opts.Faults; f != nil && f.BetweenReleaseHalves != nil {
				if err := f.BetweenReleaseHalves(); err != nil {
					return err
				}
			}
			if _, err := w.conn.ExecContext(ctx, `DELETE FROM held_publishes WHERE channel = ? AND client = ? AND packet_id = ?`,
				ch.id, clientID, int64(packetID)); err != nil {
				return fmt.Errorf("delete the hold: %w", err)
			}
			var err error
			if ch.kind == kindAppend {
				_, err = w.st[stUpdateNextBytes].ExecContext(ctx, int64(next+1), bytes+r.enc.size, ch.id)
			} else {
				_, err = w.st[stUpdateNext].ExecContext(ctx, int64(next+1), ch.id)
			}
			return err
		}, func() {
			ch.next, ch.bytes, ch.depth = next+1, bytes+r.enc.size-old, depth
		})
		if err != nil {
			return err
		}
		w.stats.committedRecords.Add(1)
		out = r.out
		return nil
	})
	if err != nil {
		return storage.Record{}, p.wrap("release a QoS 2 publish into "+name, err)
	}
	return out, nil
}

// DropHold deletes a hold by its channel's name, open or not (a channel
// removed from the configuration keeps its row until the broker's start
// drops it). Deleting only frees, so it may use the reserve.
func (p *Provider) DropHold(channel, clientID string, packetID uint16) (bool, error) {
	var n int64
	err := p.do(func(w *writer) error {
		return w.txn(true, func(ctx context.Context) error {
			res, err := w.conn.ExecContext(ctx, `DELETE FROM held_publishes
				WHERE channel = (SELECT id FROM channels WHERE name = ?) AND client = ? AND packet_id = ?`,
				channel, clientID, int64(packetID))
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
	})
	if err != nil {
		return false, p.wrap("drop a QoS 2 hold in "+channel, err)
	}
	return n > 0, nil
}

// Holds lists every hold row, of open channels and of channels nobody
// opened, read on the writer (rare: start-up and the expiry sweep).
func (p *Provider) Holds() ([]storage.Held, error) {
	var out []storage.Held
	err := p.do(func(w *writer) error {
		out = out[:0]
		rows, err := w.conn.QueryContext(context.Background(), `SELECT c.name, h.client, h.packet_id, h.held_at, 1, `+
			heldColumns+` FROM held_publishes h JOIN channels c ON c.id = h.channel ORDER BY c.name, h.client, h.packet_id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var h storage.Held
			var pid, at int64
			var s recordScan
			dest := append([]any{&h.Channel, &h.ClientID, &pid, &at}, s.recordDest()...)
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			rec, err := s.record()
			if err != nil {
				return fmt.Errorf("hold of client %q packet id %d: %w", h.ClientID, pid, err)
			}
			if pid < 1 || pid > 0xFFFF {
				return fmt.Errorf("hold of client %q: packet id %d out of range", h.ClientID, pid)
			}
			rec.Offset = 0
			h.PacketID, h.HeldAt, h.Record = uint16(pid), timeFromDB(at), rec
			out = append(out, h)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, p.wrap("list QoS 2 holds", err)
	}
	return out, nil
}

// AbandonedAtOpen is always 0: a row survives exactly as long as the file.
func (p *Provider) AbandonedAtOpen() int { return 0 }
