// Package store owns Berth's connection to its MongoDB-wire state store (a MongoDB replica set given
// by URI, or FerretDB run in-process over SQLite under the data directory; DESIGN.md section 4) and
// the in-memory read view of it that berthd's loops read (view.go, docs/store.md).
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// DefaultDatabase is the database name used when [Config.Database] is empty.
const DefaultDatabase = "berth"

// startTimeout bounds how long Open waits for a server to answer its first ping
// when the caller's ctx carries no earlier deadline.
const startTimeout = 30 * time.Second

// Config says which store to open. The zero value is invalid only because DataDir is required
// for the embedded store.
type Config struct {
	// URI is a mongodb:// or mongodb+srv:// connection string. Empty means the embedded store
	// (FerretDB over SQLite) under DataDir.
	URI string
	// DataDir is the Berth data directory; required when URI is empty. The embedded store keeps
	// its files in DataDir/store/ (created 0700). Ignored when URI is set.
	DataDir string
	// Database is the database name; empty means [DefaultDatabase].
	Database string
	// Logger receives the store's own messages and, at a quieter level, FerretDB's. Nil discards.
	Logger *slog.Logger
	// Metrics, when not nil, receives berth_store_operations_total and
	// berth_store_operation_duration_seconds (docs/operating.md "Metrics"): every command the
	// driver sends, by command name, collection and outcome. Open panics, as MustRegister does,
	// when Metrics holds them already.
	Metrics prometheus.Registerer
}

// Store is an open connection to the state store. It is safe for concurrent use. Close it once.
type Store struct {
	client   *mongo.Client
	db       *mongo.Database
	log      *slog.Logger
	embedded bool
	ferret   bool // the server is FerretDB (embedded or behind Config.URI)
	majority bool // majority read and write concerns are applied to DB

	server *embeddedServer // nil unless embedded

	// stopIndexer ends the embedded store's _id indexer (idindex.go); nil
	// when none runs.
	stopIndexer func()

	// view is the read view (view.go); never nil.
	view *View
	// stopView turns the view off and ends its change stream; nil when the view is off.
	stopView func()
	// viewClient is the embedded store's second connection, used only by the view's re-reads so
	// they do not queue behind writes on the one connection that writes (nil otherwise).
	viewClient *mongo.Client

	// cmdMetrics counts the commands of client (nil without Config.Metrics); the view's
	// client counts into the same families through a sibling.
	cmdMetrics *commandMetrics

	// casMu serialises UpdateIf on FerretDB (see [Store.UpdateIf]).
	casMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
}

// Open connects to the store described by cfg and returns once the server answers a ping.
//
// With an empty cfg.URI it starts FerretDB in-process on a loopback port with its SQLite files in
// cfg.DataDir/store/. The caller must hold [LockDir] on cfg.DataDir so no second process opens
// the same files. Whenever the server is FerretDB (embedded or detected behind cfg.URI), the
// driver pool is limited to one connection, because FerretDB v1 does not apply concurrent updates
// of one document atomically; Open logs that at Info. There, unless the URI asks for TLS, the
// driver is also told that the server takes at most [FerretWriteBatch] statements per write
// command, so it splits larger InsertMany and BulkWrite calls (docs/store.md section 2.1). On a replica set, the database handle uses
// majority write and read concerns; on FerretDB it does too unless the server refuses them.
//
// ctx bounds the start; without a deadline Open waits at most 30 s for the first ping.
// On failure everything started is stopped again.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Database == "" {
		cfg.Database = DefaultDatabase
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "store")

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}

	s := &Store{log: log, view: newView(cfg.Database, log)}
	uri := cfg.URI
	if uri == "" {
		if cfg.DataDir == "" {
			return nil, errors.New("store: open embedded store: Config.DataDir is required when Config.URI is empty")
		}
		dir, err := filepath.Abs(filepath.Join(cfg.DataDir, "store"))
		if err != nil {
			return nil, fmt.Errorf("store: resolve data directory: %w", err)
		}
		srv, err := startEmbedded(dir, log)
		if err != nil {
			return nil, err
		}
		s.server = srv
		s.embedded = true
		s.ferret = true
		uri = srv.uri
	} else {
		ferret, err := detectFerretDB(ctx, uri)
		if err != nil {
			return nil, err
		}
		s.ferret = ferret
	}

	if cfg.Metrics != nil {
		s.cmdMetrics = newCommandMetrics(cfg.Metrics)
	}
	opts := options.Client().ApplyURI(uri).SetAppName("berthd").SetMonitor(joinMonitors(s.view.monitor(), s.cmdMetrics))
	if s.ferret {
		opts.SetMaxPoolSize(1)
		reason := "FerretDB detected behind the configured URI"
		if s.embedded {
			reason = "embedded FerretDB store"
		}
		log.Info("store: limiting the connection pool to one connection",
			"reason", reason,
			"why", "FerretDB v1 does not apply concurrent updates of one document atomically; one connection serialises them")
		if opts.TLSConfig == nil {
			// Over TLS the dialed connection carries encrypted bytes the cap cannot read.
			opts.SetDialer(newBatchCapDialer(FerretWriteBatch))
			log.Info("store: splitting multi-statement writes", "max_statements_per_command", FerretWriteBatch,
				"why", "FerretDB v1 stalls for good on an update command of about 100 statements")
		} else {
			log.Warn("store: FerretDB over TLS: multi-statement writes are not split; an update command of about 100 statements stalls it",
				"max_statements_per_command", FerretWriteBatch)
		}
	}
	client, err := mongo.Connect(opts)
	if err != nil {
		s.stopServer(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	s.client = client

	if err := client.Ping(ctx, nil); err != nil {
		_ = s.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("store: first ping: %w", err)
	}

	if err := s.chooseConcerns(ctx, cfg.Database); err != nil {
		_ = s.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	if s.embedded {
		if err := s.startIDIndexer(ctx, cfg.Database); err != nil {
			_ = s.Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	if err := s.startView(ctx, uri, cfg.Database); err != nil {
		_ = s.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return s, nil
}

// startView turns the read view on where it can see every write: the embedded store (this
// process is its only client) and a MongoDB replica set (change streams name other processes'
// writes). FerretDB behind a URI and a MongoDB server without a replica set may have writers the
// view cannot see, so reads go to the store there.
//
// On the embedded store the view re-reads through connections of its own (at most 4): they only
// read (FerretDB's lack of atomicity concerns concurrent updates), SQLite in WAL mode serves them
// beside the writing connection, and a write whose reply came back is committed, so a re-read
// issued after it sees it.
func (s *Store) startView(ctx context.Context, uri, database string) error {
	s.view.db = s.db
	replicaSet := s.majority && !s.ferret
	if !s.embedded && !replicaSet {
		s.log.Info("store: read view off; reads go to the store", "reason", "other writers cannot be observed on this server")
		return nil
	}
	if s.embedded {
		vopts := options.Client().ApplyURI(uri).SetAppName("berthd-view").SetMaxPoolSize(4)
		if s.cmdMetrics != nil {
			vopts.SetMonitor(joinMonitors(nil, s.cmdMetrics.sibling()))
		}
		c, err := mongo.Connect(vopts)
		if err != nil {
			return fmt.Errorf("store: connect the read view: %w", err)
		}
		if err := c.Ping(ctx, nil); err != nil {
			_ = c.Disconnect(context.WithoutCancel(ctx))
			return fmt.Errorf("store: connect the read view: %w", err)
		}
		s.viewClient = c
		s.view.db = c.Database(database)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	s.view.enabled.Store(true)
	if replicaSet {
		wg.Add(1)
		go func() { defer wg.Done(); s.view.watch(ctx, s.db) }()
	}
	s.stopView = func() {
		s.view.enabled.Store(false)
		cancel()
		wg.Wait()
	}
	return nil
}

// View returns the store's read view (view.go). With the view off, its reads go to the store, so
// callers never branch on it. Valid until Close.
func (s *Store) View() *View { return s.view }

// startIDIndexer indexes the embedded store's existing tables for lookups by
// _id before Open returns, and keeps indexing new ones until Close
// (idindex.go).
func (s *Store) startIDIndexer(ctx context.Context, database string) error {
	x, err := openIDIndexer(s.server.dir, database, s.log)
	if err != nil {
		return err
	}
	if _, err := x.ensure(ctx); err != nil {
		_ = x.close()
		return err
	}
	ictx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		x.run(ictx)
	}()
	s.stopIndexer = func() {
		cancel()
		<-done
		_ = x.close()
	}
	return nil
}

// detectFerretDB reports whether the server behind uri is FerretDB, using a short-lived
// one-connection client: FerretDB's buildInfo answer carries "ferretdbVersion" (v1) or a
// "ferretdb" document (v2); MongoDB's never does.
func detectFerretDB(ctx context.Context, uri string) (bool, error) {
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetMaxPoolSize(1))
	if err != nil {
		return false, fmt.Errorf("store: connect to probe the server: %w", err)
	}
	defer func() { _ = c.Disconnect(context.WithoutCancel(ctx)) }()

	var info bson.M
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err != nil {
		return false, fmt.Errorf("store: probe the server with buildInfo: %w", err)
	}
	return isFerretBuildInfo(info), nil
}

func isFerretBuildInfo(info bson.M) bool {
	for k := range info {
		if strings.HasPrefix(strings.ToLower(k), "ferretdb") {
			return true
		}
	}
	return false
}

// chooseConcerns sets s.db: majority concerns on a replica set, and on FerretDB when it accepts
// a majority read; the server's defaults otherwise.
func (s *Store) chooseConcerns(ctx context.Context, database string) error {
	var hello bson.M
	if err := s.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return fmt.Errorf("store: hello: %w", err)
	}
	_, replicaSet := hello["setName"]

	majority := options.Database().
		SetWriteConcern(writeconcern.Majority()).
		SetReadConcern(readconcern.Majority())
	switch {
	case replicaSet:
		s.db = s.client.Database(database, majority)
		s.majority = true
	case s.ferret:
		db := s.client.Database(database, majority)
		err := db.Collection(SequencesCollection).FindOne(ctx, bson.D{}).Err()
		if err == nil || errors.Is(err, mongo.ErrNoDocuments) {
			s.db = db
			s.majority = true
			break
		}
		s.log.Info("store: FerretDB refused majority read concern; using its defaults", "err", err)
		s.db = s.client.Database(database)
	default:
		s.log.Warn("store: the server is not a replica set; majority read and write concerns are not available, using defaults")
		s.db = s.client.Database(database)
	}
	return nil
}

// DB returns the database handle (majority concerns where available). Valid until Close.
func (s *Store) DB() *mongo.Database { return s.db }

// Collection returns the named collection of [Store.DB].
func (s *Store) Collection(name string) *mongo.Collection { return s.db.Collection(name) }

// Embedded reports whether this store runs FerretDB in-process under the data directory.
func (s *Store) Embedded() bool { return s.embedded }

// EmbeddedURI returns the loopback mongodb:// URI of the embedded FerretDB server, or "" when the
// store is not embedded. Another process of the same host may connect to it while this store is
// open (tests use it to run several control planes on one store).
//
// Handing the URI out turns this store's read view off for good ([View.Enabled]): writes by
// other clients do not pass this store's command monitor.
func (s *Store) EmbeddedURI() string {
	if s.server == nil {
		return ""
	}
	s.view.disable("the embedded store's URI was handed out; other clients may write")
	return s.server.uri
}

// FerretDB reports whether the server is FerretDB (embedded or detected behind the URI), in
// which case the driver uses a single connection.
func (s *Store) FerretDB() bool { return s.ferret }

// Majority reports whether the database handle applies majority read and write concerns.
func (s *Store) Majority() bool { return s.majority }

// Ping round-trips to the server; it returns the driver's error wrapped when the server does
// not answer before ctx ends.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx, nil); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

// Close disconnects the client and, for the embedded store, stops FerretDB and waits until its
// SQLite files are closed, bounded by ctx. It is idempotent; later calls return the first result.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.stopView != nil {
			s.stopView()
		}
		if s.stopIndexer != nil {
			s.stopIndexer()
		}
		if s.viewClient != nil {
			if err := s.viewClient.Disconnect(ctx); err != nil {
				errs = append(errs, fmt.Errorf("store: disconnect the read view: %w", err))
			}
		}
		if s.client != nil {
			if err := s.client.Disconnect(ctx); err != nil {
				errs = append(errs, fmt.Errorf("store: disconnect: %w", err))
			}
		}
		if err := s.stopServer(ctx); err != nil {
			errs = append(errs, err)
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

func (s *Store) stopServer(ctx context.Context) error {
	if s.server == nil {
		return nil
	}
	return s.server.stop(ctx)
}
