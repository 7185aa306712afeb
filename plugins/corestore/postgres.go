package corestore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/berthhq/berth/abi/bindings"
)

// pgMaxName is PostgreSQL's identifier limit (NAMEDATALEN - 1).
const pgMaxName = 63

// postgres is the PostgreSQL backend: one database and one login role of
// the same name per binding, the role owning the database and PUBLIC
// revoked from it.
type postgres struct{ cfg *ServerConfig }

func (p postgres) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, p.cfg.AdminURL)
	if err != nil {
		return nil, unreachable("connect to the PostgreSQL server", err)
	}
	return c, nil
}

func (p postgres) plan(_ context.Context, n names) (bindings.State, error) {
	host, port := p.cfg.workloadAddr()
	return bindings.State{Database: n.Database, User: n.User, Endpoint: hostPort(host, port), Users: bindings.UsersOwn}, nil
}

func (p postgres) ensure(ctx context.Context, n names, password string) error {
	c, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	role := pgx.Identifier{n.User}.Sanitize()
	db := pgx.Identifier{n.Database}.Sanitize()
	// password is hex (derivePassword), so it needs no escaping beyond
	// the quotes; it is never logged (the statement is not either).
	var one int
	err = c.QueryRow(ctx, "SELECT 1 FROM pg_roles WHERE rolname = $1", n.User).Scan(&one)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		_, err = c.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD '"+password+"'")
		if isPgCode(err, "42710") { // duplicate_object: made meanwhile
			_, err = c.Exec(ctx, "ALTER ROLE "+role+" WITH LOGIN PASSWORD '"+password+"'")
		}
	case err == nil:
		_, err = c.Exec(ctx, "ALTER ROLE "+role+" WITH LOGIN PASSWORD '"+password+"'")
	}
	if err != nil {
		return fmt.Errorf("postgres: role %s: %w", n.User, err)
	}
	err = c.QueryRow(ctx, "SELECT 1 FROM pg_database WHERE datname = $1", n.Database).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = c.Exec(ctx, "CREATE DATABASE "+db+" OWNER "+role)
		if isPgCode(err, "42P04") { // duplicate_database: made meanwhile
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("postgres: database %s: %w", n.Database, err)
	}
	if _, err := c.Exec(ctx, "REVOKE ALL ON DATABASE "+db+" FROM PUBLIC"); err != nil {
		return fmt.Errorf("postgres: database %s: %w", n.Database, err)
	}
	if _, err := c.Exec(ctx, "ALTER DATABASE "+db+" OWNER TO "+role); err != nil {
		return fmt.Errorf("postgres: database %s: %w", n.Database, err)
	}
	return nil
}

func (p postgres) exists(ctx context.Context, n names) (bool, error) {
	c, err := p.connect(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	var one int
	err = c.QueryRow(ctx, "SELECT 1 FROM pg_database WHERE datname = $1", n.Database).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("postgres: %w", err)
	}
	return true, nil
}

func (p postgres) purge(ctx context.Context, n names) error {
	c, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n.Database}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("postgres: drop database %s: %w", n.Database, err)
	}
	if _, err := c.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{n.User}.Sanitize()); err != nil {
		return fmt.Errorf("postgres: drop role %s: %w", n.User, err)
	}
	return nil
}

func (p postgres) list(ctx context.Context) ([]string, error) {
	c, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	rows, err := c.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'berth\_%' ORDER BY datname`)
	if err != nil {
		return nil, fmt.Errorf("postgres: list databases: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("postgres: list databases: %w", err)
	}
	return out, nil
}

func (p postgres) credentials(st bindings.State, password string) map[string]string {
	host, port := p.cfg.workloadAddr()
	u := url.URL{Scheme: "postgres", User: url.UserPassword(st.User, password), Host: hostPort(host, port),
		Path: "/" + st.Database, RawQuery: "sslmode=" + p.sslMode()}
	return map[string]string{
		"URL": u.String(), "HOST": host, "PORT": strconv.Itoa(port),
		"USER": st.User, "PASSWORD": password, "DATABASE": st.Database,
	}
}

func isPgCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// sslMode is the admin URL's sslmode, or "prefer": workloads reach the server
// the way the plugin does.
func (p postgres) sslMode() string {
	if u, err := url.Parse(p.cfg.AdminURL); err == nil {
		if m := u.Query().Get("sslmode"); m != "" {
			return m
		}
	}
	return "prefer"
}
