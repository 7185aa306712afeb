package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/nodeplugins/containerd"
	"github.com/berthhq/berth/nodeplugins/containerd/ctrtest"
	"github.com/berthhq/berth/nodeplugins/nftables"
	"github.com/berthhq/berth/sdk/runtime"
)

// startRuns is how many workloads BenchmarkContainerStart starts.
const startRuns = 20

// BenchmarkContainerStart measures what a node does between receiving a
// workload and its container running: network attach (namespace, veth,
// one nftables batch) and the driver's Start (image imported from an OCI
// layout on the first start, cached after), over startRuns workloads; it
// reports the p50 and p99 in milliseconds.
func BenchmarkContainerStart(b *testing.B) {
	addr := ctrtest.Address(b)
	ns := ctrtest.Namespace(b, addr)
	archive, dg := ctrtest.Archive(b, ctrtest.Image(b, ctrtest.Config{Cmd: []string{"sleep", "300"}}))
	ctx := context.Background()
	d, err := containerd.New(ctx, containerd.Config{Address: addr, Namespace: ns, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	net := benchNetwork(b)
	var times []time.Duration
	b.ResetTimer()
	for b.Loop() {
		times = times[:0]
		for i := range startRuns {
			id := fmt.Sprintf("wl_bench_%d", i)
			t0 := time.Now()
			a, err := net.Attach(ctx, nftables.AttachRequest{WorkloadID: id, Group: "prj_bench"})
			if err != nil {
				b.Fatal(err)
			}
			r, err := d.Start(ctx, &runtime.StartRequest{WorkloadID: id, Image: dg, ImageArchive: archive,
				LogPath: filepath.Join(b.TempDir(), "out.log"), NetworkNamespace: a.NetNSPath(),
				Mutation: runtime.Mutation{IdempotencyKey: fmt.Sprintf("bench-%d-%d", i, time.Now().UnixNano())}})
			if err != nil || r.State.State != runtime.StateRunning {
				b.Fatalf("start %s: %v", id, err)
			}
			times = append(times, time.Since(t0))
		}
		b.StopTimer()
		for i := range startRuns {
			id := fmt.Sprintf("wl_bench_%d", i)
			if _, err := d.Stop(ctx, &runtime.StopRequest{WorkloadID: id, Mode: runtime.StopForced,
				Mutation: runtime.Mutation{IdempotencyKey: fmt.Sprintf("bench-stop-%d-%d", i, time.Now().UnixNano())}}); err != nil {
				b.Fatal(err)
			}
			if err := net.Detach(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(times[0].Microseconds())/1000, "min-ms")
}

// BenchmarkNftablesApply100 measures one nftables batch that replaces the
// whole ruleset of 100 workloads (10 projects, one published port each).
func BenchmarkNftablesApply100(b *testing.B) {
	addr := ctrtest.Address(b) // the same privileges as the container benchmarks
	_ = addr
	net := benchNetwork(b)
	ctx := context.Background()
	t0 := time.Now()
	for i := range 100 {
		if _, err := net.Attach(ctx, nftables.AttachRequest{WorkloadID: fmt.Sprintf("wl_nft_%03d", i),
			Group: fmt.Sprintf("prj_%d", i%10), Ports: []nftables.Port{{HostPort: uint16(20000 + i), ContainerPort: 8080}}}); err != nil {
			b.Fatal(err)
		}
	}
	attach := time.Since(t0)
	b.ResetTimer()
	for b.Loop() {
		if err := net.Reapply(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(attach.Microseconds())/1000/100, "attach-ms/workload")
}

func benchNetwork(b *testing.B) *nftables.Network {
	b.Helper()
	n, err := nftables.New(nftables.Config{Subnet: netip.MustParsePrefix("10.214.0.0/22"), Bridge: "bberth0",
		TablePrefix: "bberth", StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := n.Guard(ctx); err != nil {
		b.Fatal(err)
	}
	if err := n.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := n.Teardown(context.Background()); err != nil {
			b.Error(err)
		}
	})
	return n
}

// BenchmarkDesiredToRunning measures, through the agent's reconcile loop on
// the containerd driver and the node network, the time from a desired state
// stored on the node (one new workload in it) to that workload's container
// running, over startRuns snapshots; it reports the p50 and p99 in ms. The
// image comes from a bundle (an OCI layout), imported on the first start.
func BenchmarkDesiredToRunning(b *testing.B) {
	addr := ctrtest.Address(b)
	ns := ctrtest.Namespace(b, addr)
	archive, image := ctrtest.Archive(b, ctrtest.Image(b, ctrtest.Config{}))
	tarBytes, err := os.ReadFile(archive)
	if err != nil {
		b.Fatal(err)
	}
	var gz bytes.Buffer // a bundle is gzipped, as 'berth image push' uploads it
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(tarBytes)
	if err := zw.Close(); err != nil {
		b.Fatal(err)
	}
	raw := gz.Bytes()
	sum := sha256.Sum256(raw)
	src := benchBundle{digest: "sha256:" + hex.EncodeToString(sum[:]), data: raw}
	ctx := context.Background()
	d, err := containerd.New(ctx, containerd.Config{Address: addr, Namespace: ns, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	net := benchNetwork(b)
	var times []time.Duration
	for b.Loop() {
		dir := b.TempDir()
		st, err := localstore.Open(ctx, filepath.Join(dir, localstore.FileName))
		if err != nil {
			b.Fatal(err)
		}
		loop, err := reconcile.New(reconcile.Config{Store: st, Driver: d, Bundles: src, DataDir: dir,
			Network: benchLoopNetwork{net}, StopTimeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		times = times[:0]
		var specs []node.WorkloadSpec
		for i := range startRuns {
			specs = append(specs, node.WorkloadSpec{WorkloadID: fmt.Sprintf("wl_dtr_%d", i), ProjectID: "prj_bench", Project: "bench",
				ServiceID: "svc_bench", Service: "web", Driver: "containerd", BundleDigest: src.digest, Image: image,
				Command: []string{"sleep", "300"}, DesiredStatus: node.DesiredRunning})
			body, _ := json.Marshal(node.DesiredState{Rev: int64(i + 1), Spec: node.Spec{Workloads: specs}})
			t0 := time.Now()
			if _, err := st.StoreSnapshot(ctx, int64(i+1), body, t0); err != nil {
				b.Fatal(err)
			}
			if _, err := loop.Pass(ctx); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(t0))
			if s, err := d.Inspect(ctx, &runtime.InspectRequest{WorkloadID: specs[i].WorkloadID}); err != nil || s.State != runtime.StateRunning {
				b.Fatalf("workload %s not running after its pass: %v", specs[i].WorkloadID, err)
			}
		}
		b.StopTimer()
		body, _ := json.Marshal(node.DesiredState{Rev: startRuns + 1, Spec: node.Spec{Workloads: []node.WorkloadSpec{}}})
		if _, err := st.StoreSnapshot(ctx, startRuns+1, body, time.Now()); err != nil {
			b.Fatal(err)
		}
		if _, err := loop.Pass(ctx); err != nil {
			b.Fatal(err)
		}
		_ = st.Close()
		b.StartTimer()
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1000, "p99-ms")
}

// benchBundle serves one bundle from memory, standing for berthd's bundle endpoint.
type benchBundle struct {
	digest string
	data   []byte
}

func (s benchBundle) DownloadBundle(_ context.Context, digest string, w io.Writer) error {
	if digest != s.digest {
		return fmt.Errorf("no bundle %s", digest)
	}
	_, err := w.Write(s.data)
	return err
}

// benchLoopNetwork adapts the nftables network as cmd/berth-agent does.
type benchLoopNetwork struct{ n *nftables.Network }

func (a benchLoopNetwork) Attach(ctx context.Context, id, group string, port int, _ pluginapi.Mutation) (string, error) {
	at, err := a.n.Attach(ctx, nftables.AttachRequest{WorkloadID: id, Group: group,
		Ports: []nftables.Port{{HostPort: uint16(port), ContainerPort: uint16(port)}}})
	return at.NetNSPath(), err
}

func (a benchLoopNetwork) Detach(ctx context.Context, id string, _ pluginapi.Mutation) error {
	return a.n.Detach(ctx, id)
}
