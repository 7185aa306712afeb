package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berthhq/berth/abi/pluginapi"
	hostplugin "github.com/berthhq/berth/host/plugin"
)

// instance is one running plugin as the suite sees it.
type instance struct {
	raw        any // *provider.Client or *runtime.Client
	negotiated int // contract version go-plugin negotiated; the only one in process
	pid        int // zero in process
	client     *goplugin.Client
	// shutdown ends the plugin the way its host does when the host stops:
	// go-plugin's graceful stop of the process, or, in process, the end of
	// the gRPC server and the implementation's Close. Idempotent.
	shutdown func()
}

// crash kills the plugin process with SIGKILL, as a crash would.
func (in *instance) crash() error {
	if in.pid <= 0 {
		return errors.New("no process")
	}
	return syscall.Kill(in.pid, syscall.SIGKILL)
}

// kind says how to reach one kind of plugin.
type kind struct {
	cookie    string
	name      string
	version   int
	newClient func(life context.Context, conn grpc.ClientConnInterface) any
	register  func(s *grpc.Server, impl any)
}

// glue is go-plugin glue with both sides, for the suite.
type glue struct {
	goplugin.NetRPCUnsupportedPlugin
	k kind
}

func (g *glue) GRPCServer(*goplugin.GRPCBroker, *grpc.Server) error {
	return errors.New("berth conformance: serves nothing")
}

func (g *glue) GRPCClient(ctx context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (interface{}, error) {
	return g.k.newClient(ctx, conn), nil
}

// startBinary launches path as a plugin of kind k over go-plugin (the real
// handshake, version negotiation and gRPC) and returns the instance, or the
// launch error. The process is killed at the end of the case.
func startBinary(t T, path string, args []string, k kind, cookie string, stderr io.Writer) (*instance, error) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = os.Environ()
	if stderr == nil {
		stderr = io.Discard
	}
	tail := &hostplugin.StderrTail{}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  goplugin.HandshakeConfig{MagicCookieKey: pluginapi.MagicCookieKey, MagicCookieValue: cookie},
		VersionedPlugins: map[int]goplugin.PluginSet{k.version: {k.name: &glue{k: k}}},
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		Stderr:           io.MultiWriter(tail, stderr),
		SyncStdout:       io.Discard,
		SyncStderr:       stderr,
	})
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		// Kill waits for go-plugin's goroutines, among them the one that
		// waited for the process: ProcessState is set once it returns.
		client.Kill()
		le := &hostplugin.LaunchError{Binary: path, Args: args, Stderr: tail.Lines(), Err: err}
		if ps := cmd.ProcessState; ps != nil {
			le.Exit = ps.String()
		}
		return nil, le
	}
	raw, err := rpc.Dispense(k.name)
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("dispense: %w", err)
	}
	in := &instance{raw: raw, negotiated: client.NegotiatedVersion(), client: client, shutdown: client.Kill}
	if rc := client.ReattachConfig(); rc != nil {
		in.pid = rc.Pid
	}
	return in, nil
}

// startInProcess serves impl over a real gRPC connection on a unix socket.
func startInProcess(t T, impl any, k kind) (*instance, error) {
	t.Helper()
	dir, err := os.MkdirTemp("", "bc")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	k.register(srv, impl)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = conn.Close() })
	var once sync.Once
	shutdown := func() {
		once.Do(func() {
			srv.Stop()
			_ = conn.Close()
			if c, ok := impl.(interface{ Close() error }); ok {
				_ = c.Close()
			}
		})
	}
	return &instance{raw: k.newClient(nil, conn), negotiated: k.version, shutdown: shutdown}, nil
}
