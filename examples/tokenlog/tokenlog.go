// Package tokenlog is an example of an output observer inserted at the
// tail of the step loop from outside package stages: after postprocess it
// writes every token the engine emits as one JSON line, registered under
// its own slot "token-log". A config inserts it:
//
//	pipeline:
//	  insert:
//	    - after: postprocess
//	      stage: token-log
//	      options: {path: tokens.jsonl}
//
// and each generated token gives a line such as
//
//	{"step":7,"request_id":"gen-1","index":0,"token":17,"text":" main"}
//
// # The contract it follows
//
// A stage inserted after postprocess is a pipeline.Stage[*stages.StepOutputs,
// *stages.StepOutputs], registered with stages.RegisterInsert. It sees each
// step's report: Outputs, the increments the step emitted to requests
// (each output's new TokenIDs and Text, Finished with its FinishReason),
// and Sampled and Finished, which the scheduler applies. The loop's
// feedback edge to schedule runs through it, so it must pass every
// *StepOutputs on unchanged and promptly: the next steps wait for it. With
// zero-overhead scheduling a step may sample a row for a sequence that
// finished the step before; that row is reported in Sampled but never
// emitted in Outputs, so an observer of Outputs sees exactly the tokens
// the requests get. Work done once (opening the file) belongs in Start
// (pipeline.Starter), so that building the graph (the graph command) has
// no side effect; resources are released in Close (pipeline.Closer).
package tokenlog

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// Slot is the slot name configs insert the logger under; its one
// implementation is "default".
const Slot = "token-log"

// Options are the logger's options (the insertion's options in YAML).
type Options struct {
	// Path is the file the lines go to, relative to the working directory,
	// created (or truncated) when the engine starts; "" or "-" is standard
	// error.
	Path string `yaml:"path"`
}

// Line is one line of the log: one generated token, in the order the
// engine emitted them. An output that ends without a new token (an abort,
// an error) gets one line with no token, so its end is logged too.
type Line struct {
	Step      int64  `json:"step"`       // the step that emitted the token
	RequestID string `json:"request_id"` // the request
	Index     int    `json:"index"`      // the output among the request's n
	Token     *int   `json:"token,omitempty"`
	// Text is the text the step's increment added, on the line of the
	// increment's last token (one token per step without speculation).
	Text string `json:"text,omitempty"`
	// FinishReason ("stop", "length", ...) is set on an output's last line.
	FinishReason string `json:"finish_reason,omitempty"`
	Error        string `json:"error,omitempty"`
}

// Register adds the logger to reg (nil: the default registry, where the
// built-in stages are) under the slot "token-log", implementation
// "default". It panics if reg already has it, as every registration does.
func Register(reg *pipeline.Registry) {
	stages.RegisterInsert(reg, Slot, "default", Options{}, func(_ stages.InsertDeps, o Options) (pipeline.Stage[*stages.StepOutputs, *stages.StepOutputs], error) {
		return &logger{path: o.Path}, nil
	})
}

// logger writes the lines through a buffer flushed once per step that
// emitted anything, so the file is complete up to the last step at any
// time. A failed write fails the run: the log would have a gap. Cost per
// step: one JSON encoding per emitted token and one write. Not safe for
// concurrent use (the graph calls Start, Process and Close from one
// goroutine at a time).
type logger struct {
	path string
	file *os.File // nil: standard error, or not started
	w    *bufio.Writer
	enc  *json.Encoder
}

// Start opens the log.
func (l *logger) Start(context.Context) error {
	var out io.Writer = os.Stderr
	if l.path != "" && l.path != "-" {
		f, err := os.Create(l.path)
		if err != nil {
			return fmt.Errorf("token-log: %w", err)
		}
		l.file, out = f, f
	}
	l.w = bufio.NewWriter(out)
	l.enc = json.NewEncoder(l.w)
	l.enc.SetEscapeHTML(false)
	return nil
}

func (l *logger) Process(_ context.Context, step *stages.StepOutputs) (*stages.StepOutputs, error) {
	if l.enc == nil {
		return nil, fmt.Errorf("token-log: step %d before Start", step.StepID)
	}
	for _, o := range step.Outputs {
		line := Line{Step: int64(step.StepID), RequestID: o.RequestID, Index: o.Index}
		last := func(line *Line) {
			line.Text = o.Text
			if o.Finished {
				line.FinishReason = o.FinishReason.String()
				if o.Err != nil {
					line.Error = o.Err.Error()
				}
			}
		}
		if len(o.TokenIDs) == 0 {
			if !o.Finished {
				continue // an increment with no token: prompt logprobs, say
			}
			last(&line)
			if err := l.enc.Encode(line); err != nil {
				return nil, fmt.Errorf("token-log: step %d: %w", step.StepID, err)
			}
			continue
		}
		for i, id := range o.TokenIDs {
			tl := line
			tl.Token = &id
			if i == len(o.TokenIDs)-1 {
				last(&tl)
			}
			if err := l.enc.Encode(tl); err != nil {
				return nil, fmt.Errorf("token-log: step %d: %w", step.StepID, err)
			}
		}
	}
	if l.w.Buffered() > 0 {
		if err := l.w.Flush(); err != nil {
			return nil, fmt.Errorf("token-log: step %d: %w", step.StepID, err)
		}
	}
	return step, nil
}

// Close flushes the log and closes its file.
func (l *logger) Close() error {
	if l.w == nil {
		return nil
	}
	err := l.w.Flush()
	if l.file != nil {
		if cerr := l.file.Close(); err == nil {
			err = cerr
		}
		l.file = nil
	}
	l.w, l.enc = nil, nil
	if err != nil {
		return fmt.Errorf("token-log: %w", err)
	}
	return nil
}
