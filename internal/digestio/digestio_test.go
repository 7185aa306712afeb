package digestio_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/digestio"
)

var errBad = errors.New("bad archive")

func TestVerifyPassesTheRightStreamAndRefusesOthers(t *testing.T) {
	body := strings.Repeat("backup ", 1000)
	sum := sha256.Sum256([]byte(body))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	for _, c := range []struct {
		name, body, digest string
		size               int64
		ok                 bool
	}{
		{"match", body, digest, int64(len(body)), true},
		{"one byte changed", "B" + body[1:], digest, int64(len(body)), false},
		{"truncated", body[:len(body)-1], digest, int64(len(body)), false},
		{"size recorded wrong", body, digest, int64(len(body)) + 1, false},
	} {
		_, err := io.ReadAll(digestio.Verify(io.NopCloser(strings.NewReader(c.body)), c.digest, c.size, errBad))
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, errBad)) {
			t.Errorf("%s: err = %v", c.name, err)
		}
	}
}
