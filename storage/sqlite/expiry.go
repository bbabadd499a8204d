package sqlite

import (
	"context"
	"errors"
	"time"
)

// dropExpiredPositions removes, at open, the positions of mqtt: readers
// whose session expired while the provider was closed: LastSeen + Expiry
// (capped by MaxSessionExpiry) at or before now. It runs on every open, even
// after a clean shutdown (docs/operations.md "Storage files"). bridge: readers are kept; they live
// while their bridge is configured. An expiry of 0 means the session ended
// with its connection, so such a position is always gone at the next start.
//
// It runs before the writer goroutine starts, directly on the connection.
func (p *Provider) dropExpiredPositions(ctx context.Context) error {
	now := p.opts.Now()
	type key struct {
		channel int64
		reader  string
	}
	var expired []key
	// ';' follows ':' in byte order: the range is exactly the mqtt: prefix.
	rows, err := p.w.conn.QueryContext(ctx,
		`SELECT channel, reader, last_seen, expiry FROM positions WHERE reader >= 'mqtt:' AND reader < 'mqtt;'`)
	if err != nil {
		return p.wrap("read positions", err)
	}
	for rows.Next() {
		var k key
		var seen, exp int64
		if err := rows.Scan(&k.channel, &k.reader, &seen, &exp); err != nil {
			rows.Close()
			return p.wrap("read positions", err)
		}
		expiry := time.Duration(exp)
		if max := p.opts.MaxSessionExpiry; max > 0 && expiry > max {
			expiry = max
		}
		if !timeFromDB(seen).Add(expiry).After(now) {
			expired = append(expired, k)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return p.wrap("read positions", err)
	}
	if len(expired) == 0 {
		return nil
	}
	err = p.w.txn(true, func(ctx context.Context) error {
		for _, k := range expired {
			if _, err := p.w.st[stDropPosition].ExecContext(ctx, k.channel, k.reader); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return p.wrap("drop expired positions", err)
	}
	p.opts.Logger.Info("dropped the positions of sessions that expired while storage was closed",
		"provider", p.opts.Name, "positions", len(expired))
	return nil
}
