package corestore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/bindings"
)

// mongoMaxName keeps database names well under MongoDB's 64-byte limit.
const mongoMaxName = 60

// markerCollection holds one document naming the binding, so that the
// database exists before the workload writes and the inventory can name it.
const markerCollection = "berth_binding"

// mongoDB is the MongoDB-wire backend: one database and one user of the same
// name with readWrite on it. A server without createUser (FerretDB v1
// answers CommandNotFound) gets the database only, and the state says
// Users "unsupported".
type mongoDB struct {
	cfg *ServerConfig

	mu     sync.Mutex
	users  string // "" until probed, then bindings.UsersOwn or bindings.UsersUnsupported; mu must be held
	client *mongo.Client
}

func (m *mongoDB) connect(ctx context.Context) (*mongo.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client != nil {
		return m.client, nil
	}
	c, err := mongo.Connect(options.Client().ApplyURI(m.cfg.AdminURL).SetServerSelectionTimeout(connectTimeout))
	if err != nil {
		return nil, unreachable("connect to the MongoDB server", err)
	}
	m.client = c
	return c, nil
}

// run runs a command in db and maps a failure to reach the server.
func (m *mongoDB) run(ctx context.Context, db string, cmd bson.D) error {
	c, err := m.connect(ctx)
	if err != nil {
		return err
	}
	err = c.Database(db).RunCommand(ctx, cmd).Err()
	if isMongoUnreachable(ctx, err) {
		return unreachable("the MongoDB server", err)
	}
	return err
}

// isMongoUnreachable reports whether err says the server did not answer:
// not an answer of the server's, and not the caller's ctx ending.
func isMongoUnreachable(ctx context.Context, err error) bool {
	var se mongo.ServerError
	return err != nil && !errors.As(err, &se) && ctx.Err() == nil
}

func mongoCode(err error) int {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return int(ce.Code)
	}
	return 0
}

// probeUsers learns whether the server makes users: usersInfo answered means
// yes, CommandNotFound (59) means no.
func (m *mongoDB) probeUsers(ctx context.Context) (string, error) {
	m.mu.Lock()
	u := m.users
	m.mu.Unlock()
	if u != "" {
		return u, nil
	}
	err := m.run(ctx, "admin", bson.D{{Key: "usersInfo", Value: 1}})
	switch {
	case err == nil:
		u = bindings.UsersOwn
	case mongoCode(err) == 59:
		u = bindings.UsersUnsupported
	default:
		return "", fmt.Errorf("mongodb: probe usersInfo: %w", err)
	}
	m.mu.Lock()
	m.users = u
	m.mu.Unlock()
	return u, nil
}

func (m *mongoDB) plan(ctx context.Context, n names) (bindings.State, error) {
	users, err := m.probeUsers(ctx)
	if err != nil {
		return bindings.State{}, err
	}
	host, port := m.cfg.workloadAddr()
	st := bindings.State{Database: n.Database, Endpoint: hostPort(host, port), Users: users}
	if users == bindings.UsersOwn {
		st.User = n.User
	}
	return st, nil
}

func (m *mongoDB) ensure(ctx context.Context, n names, password string) error {
	c, err := m.connect(ctx)
	if err != nil {
		return err
	}
	_, err = c.Database(n.Database).Collection(markerCollection).UpdateOne(ctx,
		bson.D{{Key: "_id", Value: "binding"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "id", Value: n.ID}}}},
		options.UpdateOne().SetUpsert(true))
	if isMongoUnreachable(ctx, err) {
		return unreachable("the MongoDB server", err)
	}
	if err != nil {
		return fmt.Errorf("mongodb: database %s: %w", n.Database, err)
	}
	users, err := m.probeUsers(ctx)
	if err != nil || users != bindings.UsersOwn {
		return err
	}
	roles := bson.A{bson.D{{Key: "role", Value: "readWrite"}, {Key: "db", Value: n.Database}}}
	err = m.run(ctx, n.Database, bson.D{{Key: "createUser", Value: n.User}, {Key: "pwd", Value: password}, {Key: "roles", Value: roles}})
	if mongoCode(err) == 51003 { // user exists: set its password
		err = m.run(ctx, n.Database, bson.D{{Key: "updateUser", Value: n.User}, {Key: "pwd", Value: password}, {Key: "roles", Value: roles}})
	}
	if err != nil {
		return fmt.Errorf("mongodb: user %s: %w", n.User, err)
	}
	return nil
}

func (m *mongoDB) exists(ctx context.Context, n names) (bool, error) {
	all, err := m.list(ctx)
	if err != nil {
		return false, err
	}
	for _, d := range all {
		if d == n.Database {
			return true, nil
		}
	}
	return false, nil
}

func (m *mongoDB) purge(ctx context.Context, n names) error {
	c, err := m.connect(ctx)
	if err != nil {
		return err
	}
	if users, err := m.probeUsers(ctx); err != nil {
		return err
	} else if users == bindings.UsersOwn {
		err := m.run(ctx, n.Database, bson.D{{Key: "dropUser", Value: n.User}})
		if err != nil && mongoCode(err) != 11 { // UserNotFound
			return fmt.Errorf("mongodb: drop user %s: %w", n.User, err)
		}
	}
	if err := c.Database(n.Database).Drop(ctx); err != nil {
		if isMongoUnreachable(ctx, err) {
			return unreachable("the MongoDB server", err)
		}
		return fmt.Errorf("mongodb: drop database %s: %w", n.Database, err)
	}
	return nil
}

func (m *mongoDB) list(ctx context.Context) ([]string, error) {
	c, err := m.connect(ctx)
	if err != nil {
		return nil, err
	}
	all, err := c.ListDatabaseNames(ctx, bson.D{})
	if err != nil {
		if isMongoUnreachable(ctx, err) {
			return nil, unreachable("the MongoDB server", err)
		}
		return nil, fmt.Errorf("mongodb: list databases: %w", err)
	}
	var out []string
	for _, d := range all {
		if strings.HasPrefix(d, "berth_") {
			out = append(out, d)
		}
	}
	return out, nil
}

func (m *mongoDB) credentials(st bindings.State, password string) map[string]string {
	host, port := m.cfg.workloadAddr()
	u := url.URL{Scheme: "mongodb", Host: hostPort(host, port), Path: "/" + st.Database}
	out := map[string]string{"HOST": host, "PORT": strconv.Itoa(port), "DATABASE": st.Database}
	if st.Users == bindings.UsersOwn {
		u.User = url.UserPassword(st.User, password)
		u.RawQuery = "authSource=" + url.QueryEscape(st.Database)
		out["USER"], out["PASSWORD"] = st.User, password
	}
	out["URL"] = u.String()
	return out
}

// close disconnects the client, if any.
func (m *mongoDB) close(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client != nil {
		_ = m.client.Disconnect(ctx)
		m.client = nil
	}
}
