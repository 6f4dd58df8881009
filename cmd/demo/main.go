// Command holdfast-demo is holdfast's demo: `serve` runs one HTTP app
// instance limited by a YAML config through Redis; `cluster` starts
// redis-server, N serve instances and nginx in front, drives load through
// nginx, kills Redis and brings it back, and checks and plots that the one
// shared limit held.
//
//	holdfast-demo serve --listen ADDR --redis URL [--redis-cluster] --backend goredis|rueidis --id NAME --config FILE --state-dir DIR
//	                    [--grpc-listen ADDR --rls-config FILE|DIR]   (Envoy's rate limit service: docs/envoy.md)
//	                    [--admin-listen ADDR]   (POST /admin/reset, GET /admin/peek)
//	holdfast-demo cluster [--instances 4] [--redis-cluster] [--normal 10s] [--outage 10s] [--after 10s] [--out DIR]
//
// Run either with -h for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/holdfast/holdfast/cmd/demo/cluster"
	"github.com/holdfast/holdfast/cmd/demo/serve"
)

const usage = `usage:
  holdfast-demo serve   [flags]   one limited HTTP app instance, and Envoy's rate limit service with --grpc-listen (serve -h for flags)
  holdfast-demo cluster [flags]   redis-server + N instances + nginx, load and a Redis outage (cluster -h)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	var err error
	switch os.Args[1] {
	case "serve":
		err = runServe(ctx, os.Args[2:])
	case "cluster":
		err = cluster.Main(ctx, os.Args[2:], os.Stdout, os.Stderr)
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "holdfast-demo: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "holdfast-demo:", err)
		os.Exit(1)
	}
}

func runServe(ctx context.Context, args []string) error {
	o, err := serve.Parse(args, os.Stderr)
	if err != nil {
		return err
	}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, nil)
	if o.LogFormat == "json" {
		h = slog.NewJSONHandler(os.Stderr, nil)
	}
	return serve.Run(ctx, *o, slog.New(h))
}
