// Package inverted is the lock-order walk's negative control
// (broker/lockorder_test.go): the broker's lock names, with one inversion
// planted where only the call graph shows it, one lock the order does not
// name taken under one it does, and nestings the order allows.
package inverted

import "sync"

type Broker struct {
	mu       sync.Mutex
	sessions map[string]*session
}

type session struct {
	mu sync.Mutex
	b  *Broker
}

type audit struct {
	mu sync.Mutex // not in the order
}

// allowed: Broker.mu (rank 5) then session.mu (a leaf).
func (b *Broker) expire(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil {
		s.touch()
	}
}

func (s *session) touch() {
	s.mu.Lock()
	s.mu.Unlock()
}

// planted: session.mu held while a callee two calls down takes Broker.mu.
func (s *session) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget()
}

func (s *session) forget() { s.b.drop(s) }

func (b *Broker) drop(s *session) {
	b.mu.Lock()
	delete(b.sessions, "")
	b.mu.Unlock()
}

// planted: a lock the order does not name, under Broker.mu.
func (b *Broker) note(a *audit) {
	b.mu.Lock()
	a.mu.Lock()
	a.mu.Unlock()
	b.mu.Unlock()
}
