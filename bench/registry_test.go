package bench

import (
	"context"
	"crypto/rand"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sirupsen/logrus"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/internal/s3test"
)

// benchAdmin stands in for identity.Tokens: the token endpoint is asked
// once per push or pull here (bearers last 5 minutes), and what is measured
// is the data path.
type benchAdmin struct{}

func (benchAdmin) Authenticate(context.Context, string) (*identity.Principal, error) {
	return &identity.Principal{Kind: identity.KindAdmin, ID: "tok_bench", Scopes: []identity.Scope{identity.ScopeAdmin}}, nil
}

func (b benchAdmin) Recheck(ctx context.Context, _ string) (*identity.Principal, error) {
	return b.Authenticate(ctx, "")
}

const registryLayerMiB = 32 // per layer; two layers per image

// BenchmarkRegistry pushes and pulls 64 MiB images through Berth's /v2 (token
// flow, push hooks off) and through a bare distribution registry on the same
// kind of storage, in one run, and reports both rates and their ratios.
func BenchmarkRegistry(b *testing.B) {
	logrus.SetOutput(io.Discard)
	srv := s3test.Start(b)
	bucket := srv.Bucket(b, "bench")
	s3 := blobs.S3Config{Endpoint: srv.Addr, Bucket: bucket, Insecure: true, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey}
	for _, bk := range []struct {
		name string
		s3   blobs.S3Config
	}{{"filesystem", blobs.S3Config{}}, {"versitygw", s3}} {
		b.Run(bk.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			berth := bk.s3
			berth.Prefix = "berth"
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			reg, err := registry.New(ctx, registry.Config{RootDir: b.TempDir(), S3: berth, Key: key, Tokens: benchAdmin{}})
			if err != nil {
				b.Fatal(err)
			}
			bsrv := httptest.NewServer(reg)
			defer bsrv.Close()
			bare := httptest.NewServer(handlers.NewApp(ctx, bareConfig(b, bk.s3)))
			defer bare.Close()

			var berthPush, berthPull, barePush, barePull time.Duration
			var bytes int64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				img, err := random.Image(registryLayerMiB<<20, 2)
				if err != nil {
					b.Fatal(err)
				}
				bytes += 2 * registryLayerMiB << 20
				b.StartTimer()
				// Alternate which registry goes first, so neither always
				// meets cold caches.
				runs := []func(){
					func() {
						berthPush += timed(b, func() error { return remote.Write(ref(b, bsrv.URL, "bench/app:v1"), img, benchAuth) })
						berthPull += timed(b, func() error { return pullAll(ref(b, bsrv.URL, "bench/app:v1")) })
					},
					func() {
						barePush += timed(b, func() error { return remote.Write(ref(b, bare.URL, "bench/app:v1"), img, benchAuth) })
						barePull += timed(b, func() error { return pullAll(ref(b, bare.URL, "bench/app:v1")) })
					},
				}
				runs[i%2]()
				runs[(i+1)%2]()
			}
			mb := float64(bytes) / (1 << 20)
			b.ReportMetric(mb/berthPush.Seconds(), "berth_push_MB/s")
			b.ReportMetric(mb/barePush.Seconds(), "bare_push_MB/s")
			b.ReportMetric(mb/berthPull.Seconds(), "berth_pull_MB/s")
			b.ReportMetric(mb/barePull.Seconds(), "bare_pull_MB/s")
			b.ReportMetric(barePush.Seconds()/berthPush.Seconds(), "push_ratio")
			b.ReportMetric(barePull.Seconds()/berthPull.Seconds(), "pull_ratio")
		})
	}
}

var benchAuth = remote.WithAuth(&authn.Basic{Username: "berth", Password: "brt_bench"})

func bareConfig(b *testing.B, s3 blobs.S3Config) *configuration.Configuration {
	dc := &configuration.Configuration{}
	dc.HTTP.Secret = "bench-secret"
	st := configuration.Storage{"delete": {"enabled": true}, "redirect": {"disable": true}}
	if s3.Endpoint != "" {
		st["s3"] = configuration.Parameters{"accesskey": s3.AccessKeyID, "secretkey": s3.SecretAccessKey, "region": "us-east-1", "bucket": s3.Bucket,
			"regionendpoint": "http://" + s3.Endpoint, "forcepathstyle": true, "secure": false, "rootdirectory": "/bare", "chunksize": 16 << 20}
	} else {
		st["filesystem"] = configuration.Parameters{"rootdirectory": b.TempDir()}
	}
	dc.Storage = st
	return dc
}

func ref(b *testing.B, url, s string) name.Reference {
	r, err := name.ParseReference(strings.TrimPrefix(url, "http://")+"/"+s, name.Insecure)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

func timed(b *testing.B, f func() error) time.Duration {
	start := time.Now()
	if err := f(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// pullAll fetches the manifest and reads every layer to the end.
func pullAll(r name.Reference) error {
	img, err := remote.Image(r, benchAuth)
	if err != nil {
		return err
	}
	ls, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range ls {
		if err := readLayer(l); err != nil {
			return err
		}
	}
	return nil
}

func readLayer(l v1.Layer) error {
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	return err
}
