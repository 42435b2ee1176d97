package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/server"
)

func newServeCmd(reg *pipeline.Registry) *cobra.Command {
	var (
		host, modelName  string
		port, maxPending int
		ef               engineFlags
		limits           serveLimits
		grace            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve [MODEL_DIR]",
		Short: "Serve the OpenAI-compatible HTTP API (completions, chat, models, health, metrics)",
		Long: "serve starts the engine for --config and answers the OpenAI API on --host:--port:\n" +
			"POST /v1/completions and /v1/chat/completions (streamed with \"stream\": true), GET /v1/models,\n" +
			"GET /health and GET /metrics (Prometheus). SIGTERM or Ctrl-C drains: the port stays open and new\n" +
			"generation requests (and /health) get 503 with Retry-After while in-flight ones finish within\n" +
			"--shutdown-timeout; the rest are then aborted and the exit status is 0. --api-key (or\n" +
			"$DEEPINFER_API_KEY) requires a bearer token; --allowed-origins opens CORS to browser pages.\n\n" +
			"MODEL_DIR (as vLLM's serve MODEL) is a Hugging Face model directory or a GGUF file; it overrides the config's\n" +
			"model. With neither MODEL_DIR nor --config it serves the shipped model (deepseek-tiny).",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stderr := cmd.ErrOrStderr()
			// Signals first: from here on SIGTERM drains instead of killing.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			opts := server.Options{ModelName: modelName, MaxPending: maxPending}
			if err := limits.apply(&opts, cmd.Flags().Changed("api-key"), os.Getenv); err != nil {
				return err
			}
			cfg, cleanup, err := ef.load(firstArg(args))
			if err != nil {
				return err
			}
			l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
			cleanup() // the tokenizer is loaded
			if err != nil {
				return err
			}
			start := time.Now()
			opts.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			srv, err := server.New(l.Engine, opts)
			if err != nil {
				l.Close()
				return err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				l.Close()
				return fmt.Errorf("serve: %w", err)
			}
			fmt.Fprintf(stderr, "serving %s on http://%s (POST /v1/completions /v1/chat/completions, GET /v1/models /health /metrics)\n", srv.ModelName(), ln.Addr())
			if opts.APIKey == "" {
				if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
					fmt.Fprintf(stderr, "warning: no --api-key: anyone who can reach %s can run generations\n", ln.Addr())
				}
			}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			select {
			case <-ctx.Done():
			case err := <-served:
				l.Close()
				return fmt.Errorf("serve: %w", err)
			}
			stop() // a second signal kills at once
			fmt.Fprintf(stderr, "shutting down: draining in-flight requests (up to %s)\n", grace)
			sctx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			if err := srv.Shutdown(sctx); errors.Is(err, context.DeadlineExceeded) {
				fmt.Fprintln(stderr, "shutdown: deadline reached, remaining requests aborted")
			} else if err != nil {
				fmt.Fprintln(stderr, "shutdown:", err)
			}
			if err := <-served; !errors.Is(err, server.ErrServerClosed) {
				fmt.Fprintln(stderr, "serve:", err)
			}
			ectx, ecancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ecancel()
			err = l.Shutdown(ectx)
			fmt.Fprintln(stderr, statsLine(l, time.Since(start)))
			if err != nil && !errors.Is(err, llm.ErrClosed) {
				return fmt.Errorf("serve: engine: %w", err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	ef.register(cmd, engineFlagSet{model: true, seed: true, chatTemplate: true})
	fl.StringVar(&host, "host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
	fl.IntVarP(&port, "port", "p", 8000, "port to listen on (0 picks a free one)")
	fl.StringVar(&modelName, "served-model-name", "", "model name clients use; default: the model directory's base name")
	fl.IntVar(&maxPending, "max-pending", 0, "requests admitted at once before 503; 0: engine.max_num_seqs + engine.max_waiting; -1: unbounded")
	fl.DurationVar(&grace, "shutdown-timeout", 30*time.Second, "time in-flight requests get to finish on SIGTERM before they are aborted")
	limits.register(cmd)
	return cmd
}

// firstArg returns args[0], or "" when args is empty.
func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}
