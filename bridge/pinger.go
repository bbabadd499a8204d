package bridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho/log"
)

// errPingTimeout ends a connection whose peer did not answer a PINGREQ in
// time: the link is rebuilt.
var errPingTimeout = errors.New("no PINGRESP within half the keep-alive")

// keepAlivePinger finds a dead link within 1.5× the keep-alive
// (docs/bridge.md "The link"), where paho's own pinger takes up to twice
// it: it sends a PINGREQ once nothing was received or sent for half the
// keep-alive, and gives up on a PINGRESP not back within another half. It
// looks every eighth of the keep-alive, so from the last byte received the
// link is found dead within ½ + ⅛ + ½ + ⅛ = 1.25× the keep-alive.
type keepAlivePinger struct {
	mu           sync.Mutex
	lastSent     time.Time
	lastReceived time.Time
	pingSent     time.Time // zero when no PINGREQ waits for its answer
}

func newKeepAlivePinger() *keepAlivePinger { return &keepAlivePinger{} }

// Run is paho's Pinger.Run: it returns when ctx ends, or with an error
// when the peer no longer answers (paho then closes the connection).
func (p *keepAlivePinger) Run(ctx context.Context, conn net.Conn, keepAlive uint16) error {
	if keepAlive == 0 {
		return nil
	}
	if conn == nil {
		return errors.New("pinger: no connection")
	}
	half := time.Duration(keepAlive) * time.Second / 2
	now := time.Now()
	p.mu.Lock()
	p.lastSent, p.lastReceived, p.pingSent = now, now, time.Time{}
	p.mu.Unlock()
	tick := time.NewTicker(half / 4)
	defer tick.Stop()
	errc := make(chan error, 1)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case now := <-tick.C:
			p.mu.Lock()
			waiting := !p.pingSent.IsZero()
			late := waiting && now.Sub(p.pingSent) >= half
			idle := now.Sub(p.lastReceived) >= half || now.Sub(p.lastSent) >= half
			if !waiting && idle {
				p.pingSent = now
			}
			p.mu.Unlock()
			switch {
			case late:
				return errPingTimeout
			case !waiting && idle:
				// Written aside: a write blocked on a dead link must not
				// stop the timeout above from being seen.
				go func() {
					if _, err := packets.NewControlPacket(packets.PINGREQ).WriteTo(conn); err != nil {
						select {
						case errc <- fmt.Errorf("sending PINGREQ: %w", err):
						default:
						}
					}
				}()
			}
		}
	}
}

// PacketSent is called by paho for every packet it sends.
func (p *keepAlivePinger) PacketSent() {
	p.mu.Lock()
	p.lastSent = time.Now()
	p.mu.Unlock()
}

// PacketReceived is called by paho for every packet it receives: any of
// them shows the peer is there.
func (p *keepAlivePinger) PacketReceived() {
	p.mu.Lock()
	p.lastReceived = time.Now()
	p.mu.Unlock()
}

// PingResp is called by paho for each PINGRESP.
func (p *keepAlivePinger) PingResp() {
	p.mu.Lock()
	p.pingSent = time.Time{}
	p.lastReceived = time.Now()
	p.mu.Unlock()
}

func (p *keepAlivePinger) SetDebug(log.Logger) {}
