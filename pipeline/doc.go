// Package pipeline is a generic stage graph: typed stages joined by bounded,
// typed edges, run together until the sources end or the context is cancelled.
//
// A graph holds four kinds of node:
//
//   - a Source produces items (Next returns io.EOF at the end);
//   - a Stage maps one input to one output (Process; ErrSkip drops the item);
//   - a Planner is the head of a loop: it absorbs inputs and feedback and
//     emits work whenever the loop has room (Add, Feedback, Plan);
//   - a Sink consumes items.
//
// Edges are channels of the consumer's input type with a declared capacity.
// Every send and receive also watches ctx.Done(); a producer closes its edge
// when it is done, and an input fed by several producers closes when the last
// of them is done. A feedback edge goes from the tail of a loop back to its
// Planner and carries a bound: at most MaxInFlight items are between the
// Planner's output and the feedback edge at any time. A bound of 1 makes the
// loop take strict turns; 2 lets the head of the loop work on item N+1 while
// the tail still processes item N.
//
// Types are checked when the graph is built (Build): an edge whose producer
// output is not assignable to the consumer input fails, naming both nodes and
// both types. At run time an error or a panic in any node cancels the whole
// run and Run returns it with the node's name; no goroutine outlives Run.
//
// Graphs are built from Go (Graph.Add, Connect, Feedback) or from a Spec,
// which YAML decodes into, with implementations looked up in a Registry by
// slot and name.
//
// Cost: one edge hop is one channel send and receive plus, when metrics are
// on, three monotonic clock reads per item; see BenchmarkEdgeHop.
package pipeline
