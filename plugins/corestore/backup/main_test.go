package backup_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/berthhq/berth/internal/ferrettest"
	"github.com/berthhq/berth/internal/pgtest"
	"github.com/berthhq/berth/internal/s3test"
)

// One real server of each kind for the package, started here and stopped
// when the tests end: PostgreSQL 15, FerretDB (SQLite backend) and versitygw.
var (
	pg     *pgtest.Server
	ferret *ferrettest.Server
	s3srv  *s3test.Server
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "corestore-backup-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	bin, err := pgtest.BinDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if pg, err = pgtest.StartDir(bin, freePort(), ""); err != nil {
		fmt.Fprintln(os.Stderr, "postgres:", err)
		return 1
	}
	defer pg.Stop()
	fbin, err := ferrettest.Build(tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fdir := filepath.Join(tmp, "ferret")
	if err := os.Mkdir(fdir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if ferret, err = ferrettest.StartSQLite(fbin, "127.0.0.1:"+strconv.Itoa(freePort()), fdir); err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		return 1
	}
	defer ferret.Stop()
	vbin, err := s3test.BinaryPath()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sdir := filepath.Join(tmp, "s3")
	if err := os.Mkdir(sdir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if s3srv, err = s3test.StartDir(vbin, "127.0.0.1:"+strconv.Itoa(freePort()), sdir); err != nil {
		fmt.Fprintln(os.Stderr, "versitygw:", err)
		return 1
	}
	defer s3srv.Stop()
	return m.Run()
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
