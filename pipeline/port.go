package pipeline

import (
	"reflect"
	"sync/atomic"
)

// port is the receiving end of one or more edges: a channel of the
// consumer's input type. It closes when the last producer is done.
type port interface {
	elemType() reflect.Type
	// sendAny and trySendAny send a value whose dynamic type implements the
	// element type; trySendAny never blocks and reports whether it sent.
	sendAny(stop <-chan struct{}, v any) bool
	trySendAny(v any) bool
	// recvAny receives one value (ok false when the port is closed); it
	// returns false, false when stop closes first.
	recvAny(stop <-chan struct{}) (v any, ok, stopped bool)
	addProducer()
	producerDone()
	length() int
	capacity() int
}

type inPort[T any] struct {
	ch        chan T
	producers atomic.Int32
}

func newInPort[T any](capacity int) *inPort[T] {
	return &inPort[T]{ch: make(chan T, capacity)}
}

func (p *inPort[T]) elemType() reflect.Type { return typeOf[T]() }
func (p *inPort[T]) addProducer()           { p.producers.Add(1) }
func (p *inPort[T]) length() int            { return len(p.ch) }
func (p *inPort[T]) capacity() int          { return cap(p.ch) }

func (p *inPort[T]) producerDone() {
	if p.producers.Add(-1) == 0 {
		close(p.ch)
	}
}

// send blocks until v is sent (true) or stop is closed (false).
func (p *inPort[T]) send(stop <-chan struct{}, v T) bool {
	select {
	case p.ch <- v:
		return true
	case <-stop:
		return false
	}
}

func (p *inPort[T]) trySend(v T) bool {
	select {
	case p.ch <- v:
		return true
	default:
		return false
	}
}

func (p *inPort[T]) recvAny(stop <-chan struct{}) (any, bool, bool) {
	select {
	case v, ok := <-p.ch:
		return v, ok, false
	case <-stop:
		return nil, false, true
	}
}

// Build checked that every producer's type implements T.
func (p *inPort[T]) sendAny(stop <-chan struct{}, v any) bool { return p.send(stop, v.(T)) }
func (p *inPort[T]) trySendAny(v any) bool                    { return p.trySend(v.(T)) }

// sender sends a producer's Out values into a consumer's port: directly
// when the types are identical, through an interface conversion otherwise.
type sender[Out any] struct {
	try  func(Out) bool
	send func(<-chan struct{}, Out) bool
}

func senderFor[Out any](p port) sender[Out] {
	if tp, ok := p.(*inPort[Out]); ok {
		return sender[Out]{try: tp.trySend, send: tp.send}
	}
	return sender[Out]{
		try:  func(v Out) bool { return p.trySendAny(v) },
		send: func(stop <-chan struct{}, v Out) bool { return p.sendAny(stop, v) },
	}
}

func typeOf[T any]() reflect.Type { return reflect.TypeFor[T]() }

// assignable reports whether values of type out may travel into a port of
// type in: the same type, or an interface that out implements.
func assignable(out, in reflect.Type) bool {
	return out == in || (in.Kind() == reflect.Interface && out.Implements(in))
}
