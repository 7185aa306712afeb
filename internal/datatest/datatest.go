// Package datatest starts, for one test package's TestMain, a real server of
// each kind the Corestore provider manages: PostgreSQL 15, FerretDB over
// SQLite and versitygw, each on a free loopback port.
package datatest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/berthhq/berth/internal/ferrettest"
	"github.com/berthhq/berth/internal/pgtest"
	"github.com/berthhq/berth/internal/s3test"

	"github.com/berthhq/berth/internal/proctest"
)

// Servers are the running servers; Stop ends them.
type Servers struct {
	PG     *pgtest.Server
	Ferret *ferrettest.Server
	S3     *s3test.Server
	tmp    string
}

// Start builds and starts the three servers under a new temporary
// directory named after prefix. On error nothing is left running. A missing
// program (PostgreSQL, versitygw) is an error that says how to install it.
func Start(prefix string) (_ *Servers, err error) {
	s := &Servers{}
	if s.tmp, err = os.MkdirTemp("", prefix); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	bin, err := pgtest.BinDir()
	if err != nil {
		return nil, err
	}
	if s.PG, err = pgtest.StartDir(bin, freePort(), ""); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	fbin, err := ferrettest.Build(s.tmp)
	if err != nil {
		return nil, err
	}
	fdir := filepath.Join(s.tmp, "ferret")
	if err := os.Mkdir(fdir, 0o700); err != nil {
		return nil, err
	}
	if s.Ferret, err = ferrettest.StartSQLite(fbin, "127.0.0.1:"+strconv.Itoa(freePort()), fdir); err != nil {
		return nil, fmt.Errorf("ferretdb: %w", err)
	}
	vbin, err := s3test.BinaryPath()
	if err != nil {
		return nil, err
	}
	sdir := filepath.Join(s.tmp, "s3")
	if err := os.Mkdir(sdir, 0o700); err != nil {
		return nil, err
	}
	if s.S3, err = s3test.StartDir(vbin, "127.0.0.1:"+strconv.Itoa(freePort()), sdir); err != nil {
		return nil, fmt.Errorf("versitygw: %w", err)
	}
	return s, nil
}

// Stop ends every server that runs and removes the temporary directory.
func (s *Servers) Stop() {
	if s.S3 != nil {
		s.S3.Stop()
	}
	if s.Ferret != nil {
		s.Ferret.Stop()
	}
	if s.PG != nil {
		s.PG.Stop()
	}
	if s.tmp != "" {
		_ = os.RemoveAll(s.tmp)
	}
}

// freePort is a loopback port reserved for this process (proctest.ReserveAddr).
func freePort() int {
	addr, err := proctest.ReserveAddr()
	if err != nil {
		panic(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	return n
}
