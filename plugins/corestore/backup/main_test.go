package backup_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/berthhq/berth/internal/datatest"
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
	servers, err := datatest.Start("corestore-backup-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer servers.Stop()
	pg, ferret, s3srv = servers.PG, servers.Ferret, servers.S3
	return m.Run()
}
