// Command berth is the operator CLI of Berth: it logs in to a server, applies
// services, pushes release bundles and shows nodes, services and workloads.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &app{
		stdin:  os.Stdin,
		stdout: os.Stdout,
		stderr: os.Stderr,
		getenv: os.Getenv,
	}, os.Args[1:])
	stop()
	os.Exit(code)
}
