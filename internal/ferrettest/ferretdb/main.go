// Command ferretdb is FerretDB as a process of its own for tests: a
// MongoDB-wire server on a loopback address over SQLite files or a
// PostgreSQL database, stopped by SIGTERM or SIGINT. internal/ferrettest
// builds and starts it; it is not shipped.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:27017", "TCP address to listen on")
	sqlite := flag.String("sqlite", "", "directory of the SQLite backend's files")
	postgres := flag.String("postgres", "", "PostgreSQL URL of the postgresql backend (instead of -sqlite)")
	flag.Parse()

	cfg := &ferretdb.Config{Listener: ferretdb.ListenerConfig{TCP: *listen}, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	switch {
	case *postgres != "":
		cfg.Handler, cfg.PostgreSQLURL = "postgresql", *postgres
	case *sqlite != "":
		if err := os.MkdirAll(*sqlite, 0o700); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cfg.Handler, cfg.SQLiteURL = "sqlite", (&url.URL{Scheme: "file", Path: *sqlite + "/"}).String()
	default:
		fmt.Fprintln(os.Stderr, "ferretdb: one of -sqlite or -postgres is required")
		os.Exit(2)
	}
	f, err := ferretdb.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fmt.Println(f.MongoDBURI())
	_ = f.Run(ctx)
}
