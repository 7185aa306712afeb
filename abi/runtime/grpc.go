package runtime

import (
	"context"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	pluginv1 "github.com/berthhq/berth/abi/proto/plugin/v1"
	runtimev1 "github.com/berthhq/berth/abi/proto/runtime/v1"
)

// server serves a Driver as the RuntimeDriver gRPC service.
type server struct {
	runtimev1.UnimplementedRuntimeDriverServer
	impl Driver
}

// NewServer returns the RuntimeDriver gRPC service backed by impl. Errors
// travel as described in [pluginapi.ToStatus]; optional interfaces impl lacks
// answer Unimplemented. The SDK registers it; tests may too.
func NewServer(impl Driver) runtimev1.RuntimeDriverServer { return &server{impl: impl} }

func (s *server) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (*runtimev1.DescribeResponse, error) {
	r, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Describe returned no response"))
	}
	out := &runtimev1.DescribeResponse{Name: r.Name, Version: r.Version, Capabilities: &runtimev1.Capabilities{
		OutlivesDriver: r.Capabilities.OutlivesDriver,
		IsolationModes: r.Capabilities.IsolationModes,
		Logs:           r.Capabilities.Logs,
		Stats:          r.Capabilities.Stats,
		ResourceLimits: r.Capabilities.ResourceLimits,
	}}
	for _, v := range r.APIVersions {
		out.ApiVersions = append(out.ApiVersions, int32(v))
	}
	return out, nil
}

func (s *server) Health(_ *pluginv1.HealthRequest, stream grpc.ServerStreamingServer[pluginv1.HealthReport]) error {
	return pluginapi.ServeHealth(stream.Context(), s.impl, stream.Send)
}

func (s *server) Start(ctx context.Context, req *runtimev1.StartRequest) (*runtimev1.StartResponse, error) {
	r, err := s.impl.Start(ctx, &StartRequest{
		WorkloadID:  req.GetWorkloadId(),
		Command:     req.GetCommand(),
		Env:         req.GetEnv(),
		WorkDir:     req.GetWorkDir(),
		LogPath:     req.GetLogPath(),
		LogMaxBytes: req.GetLogMaxBytes(),
		Isolation:   req.GetIsolation(),
		Mutation:    MutationFromProto(req.GetMutation()),

		Image:            req.GetImage(),
		ImageArchive:     req.GetImageArchive(),
		User:             req.GetUser(),
		MemoryBytes:      req.GetMemoryBytes(),
		CPUMillis:        req.GetCpuMillis(),
		NetworkNamespace: req.GetNetworkNamespace(),
		Cwd:              req.GetCwd(),
		FenceResource:    req.GetFenceResource(),

		RegistryCredentials: credentialsFromProto(req.GetRegistryCredentials()),
	})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return &runtimev1.StartResponse{}, nil
	}
	return &runtimev1.StartResponse{State: StateToProto(r.State)}, nil
}

func (s *server) Stop(ctx context.Context, req *runtimev1.StopRequest) (*runtimev1.StopResponse, error) {
	in := &StopRequest{WorkloadID: req.GetWorkloadId(), Mode: StopMode(req.GetMode()), Mutation: MutationFromProto(req.GetMutation()),
		FenceResource: req.GetFenceResource()}
	if req.GetTimeout() != nil {
		in.Timeout = req.GetTimeout().AsDuration()
	}
	r, err := s.impl.Stop(ctx, in)
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return &runtimev1.StopResponse{}, nil
	}
	return &runtimev1.StopResponse{State: StateToProto(r.State)}, nil
}

func (s *server) Inspect(ctx context.Context, req *runtimev1.InspectRequest) (*runtimev1.InspectResponse, error) {
	r, err := s.impl.Inspect(ctx, &InspectRequest{WorkloadID: req.GetWorkloadId()})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	return &runtimev1.InspectResponse{State: StateToProto(r)}, nil
}

func (s *server) List(ctx context.Context, _ *runtimev1.ListRequest) (*runtimev1.ListResponse, error) {
	r, err := s.impl.List(ctx)
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	out := &runtimev1.ListResponse{Workloads: make([]*runtimev1.WorkloadState, 0, len(r))}
	for _, w := range r {
		if w != nil {
			out.Workloads = append(out.Workloads, StateToProto(w))
		}
	}
	return out, nil
}

func (s *server) Recover(ctx context.Context, req *runtimev1.RecoverRequest) (*runtimev1.RecoverResponse, error) {
	r, err := s.impl.Recover(ctx, &RecoverRequest{WorkloadID: req.GetWorkloadId(), Handle: handleFromProto(req.GetHandle())})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	return &runtimev1.RecoverResponse{State: StateToProto(r)}, nil
}

// streamWriter sends each Write as one LogsChunk.
type streamWriter struct {
	stream grpc.ServerStreamingServer[runtimev1.LogsChunk]
}

func (w streamWriter) Write(p []byte) (int, error) {
	const max = 64 << 10
	n := 0
	for len(p) > 0 {
		c := p[:min(len(p), max)]
		if err := w.stream.Send(&runtimev1.LogsChunk{Data: c}); err != nil {
			return n, err
		}
		n += len(c)
		p = p[len(c):]
	}
	return n, nil
}

func (s *server) Logs(req *runtimev1.LogsRequest, stream grpc.ServerStreamingServer[runtimev1.LogsChunk]) error {
	ls, ok := s.impl.(LogStreamer)
	if !ok {
		return pluginapi.ToStatus(pluginapi.ErrUnimplemented)
	}
	err := ls.Logs(stream.Context(), &LogsRequest{WorkloadID: req.GetWorkloadId(), Follow: req.GetFollow(), TailBytes: req.GetTailBytes()}, streamWriter{stream})
	return pluginapi.ToStatus(err)
}

func (s *server) Stats(ctx context.Context, req *runtimev1.StatsRequest) (*runtimev1.StatsResponse, error) {
	sr, ok := s.impl.(StatsReporter)
	if !ok {
		return nil, pluginapi.ToStatus(pluginapi.ErrUnimplemented)
	}
	r, err := sr.Stats(ctx, &StatsRequest{WorkloadID: req.GetWorkloadId()})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Stats returned no response"))
	}
	out := &runtimev1.StatsResponse{CpuSeconds: r.CPUSeconds, MemoryBytes: r.MemoryBytes}
	if !r.At.IsZero() {
		out.At = timestamppb.New(r.At)
	}
	return out, nil
}

// Client is the host side of a driver plugin: it implements [Driver],
// [pluginapi.HealthReporter], [LogStreamer] and [StatsReporter] over the
// RuntimeDriver gRPC service. Every call runs under the caller's ctx joined
// with the plugin's lifetime, so a call in flight fails at once when the
// plugin process exits (wrapping [pluginapi.ErrPluginExited]). Errors keep
// their stable code ([pluginapi.FromStatus]); an optional call the plugin
// lacks returns an error matching [pluginapi.ErrUnimplemented]. Safe for
// concurrent use.
type Client struct {
	life   context.Context
	client runtimev1.RuntimeDriverClient
}

var (
	_ Driver                   = (*Client)(nil)
	_ LogStreamer              = (*Client)(nil)
	_ StatsReporter            = (*Client)(nil)
	_ pluginapi.HealthReporter = (*Client)(nil)
)

// NewClient returns a client over conn. life is the plugin process's
// lifetime (go-plugin cancels it when the process exits); nil means none.
func NewClient(life context.Context, conn grpc.ClientConnInterface) *Client {
	if life == nil {
		life = context.Background()
	}
	return &Client{life: life, client: runtimev1.NewRuntimeDriverClient(conn)}
}

// Done returns a channel closed when the plugin process has exited.
func (c *Client) Done() <-chan struct{} { return c.life.Done() }

const errPrefix = "runtime driver: "

// Describe implements Driver.
func (c *Client) Describe(ctx context.Context) (*DescribeResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Describe(ctx, &pluginv1.DescribeRequest{})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"describe", err)
	}
	out := &DescribeResponse{Name: r.GetName(), Version: r.GetVersion(), APIVersions: pluginapi.APIVersions(r.GetApiVersions())}
	if cp := r.GetCapabilities(); cp != nil {
		out.Capabilities = Capabilities{OutlivesDriver: cp.GetOutlivesDriver(), IsolationModes: cp.GetIsolationModes(), Logs: cp.GetLogs(), Stats: cp.GetStats(),
			ResourceLimits: cp.GetResourceLimits()}
	}
	return out, nil
}

// Health implements pluginapi.HealthReporter. The channel is closed when ctx
// ends or the plugin exits.
func (c *Client) Health(ctx context.Context) (<-chan pluginapi.HealthReport, error) {
	return pluginapi.WatchHealth(ctx, c.life, errPrefix+"health", func(ctx context.Context) (pluginapi.HealthStream, error) {
		return c.client.Health(ctx, &pluginv1.HealthRequest{})
	})
}

// Start implements Driver.
func (c *Client) Start(ctx context.Context, req *StartRequest) (*StartResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Start(ctx, &runtimev1.StartRequest{
		WorkloadId:  req.WorkloadID,
		Command:     req.Command,
		Env:         req.Env,
		WorkDir:     req.WorkDir,
		LogPath:     req.LogPath,
		LogMaxBytes: req.LogMaxBytes,
		Isolation:   req.Isolation,
		Mutation:    MutationToProto(req.Mutation),

		Image:            req.Image,
		ImageArchive:     req.ImageArchive,
		User:             req.User,
		MemoryBytes:      req.MemoryBytes,
		CpuMillis:        req.CPUMillis,
		NetworkNamespace: req.NetworkNamespace,
		Cwd:              req.Cwd,
		FenceResource:    req.FenceResource,

		RegistryCredentials: credentialsToProto(req.RegistryCredentials),
	})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"start workload "+req.WorkloadID, err)
	}
	return &StartResponse{State: StateFromProto(r.GetState())}, nil
}

// Stop implements Driver.
func (c *Client) Stop(ctx context.Context, req *StopRequest) (*StopResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	in := &runtimev1.StopRequest{WorkloadId: req.WorkloadID, Mode: string(req.Mode), Mutation: MutationToProto(req.Mutation),
		FenceResource: req.FenceResource}
	if req.Timeout != 0 {
		in.Timeout = durationpb.New(req.Timeout)
	}
	r, err := c.client.Stop(ctx, in)
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"stop workload "+req.WorkloadID, err)
	}
	return &StopResponse{State: StateFromProto(r.GetState())}, nil
}

// Inspect implements Driver.
func (c *Client) Inspect(ctx context.Context, req *InspectRequest) (*WorkloadState, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Inspect(ctx, &runtimev1.InspectRequest{WorkloadId: req.WorkloadID})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"inspect workload "+req.WorkloadID, err)
	}
	return StateFromProto(r.GetState()), nil
}

// List implements Driver.
func (c *Client) List(ctx context.Context) ([]*WorkloadState, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.List(ctx, &runtimev1.ListRequest{})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"list workloads", err)
	}
	out := make([]*WorkloadState, 0, len(r.GetWorkloads()))
	for _, w := range r.GetWorkloads() {
		out = append(out, StateFromProto(w))
	}
	return out, nil
}

// Recover implements Driver.
func (c *Client) Recover(ctx context.Context, req *RecoverRequest) (*WorkloadState, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Recover(ctx, &runtimev1.RecoverRequest{WorkloadId: req.WorkloadID, Handle: handleToProto(req.Handle)})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"recover workload "+req.WorkloadID, err)
	}
	return StateFromProto(r.GetState()), nil
}

// Logs implements LogStreamer: it copies the stream to w until it ends.
func (c *Client) Logs(ctx context.Context, req *LogsRequest, w io.Writer) error {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	stream, err := c.client.Logs(ctx, &runtimev1.LogsRequest{WorkloadId: req.WorkloadID, Follow: req.Follow, TailBytes: req.TailBytes})
	if err != nil {
		return pluginapi.FromStatus(ctx, errPrefix+"logs of workload "+req.WorkloadID, err)
	}
	for {
		chunk, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return pluginapi.FromStatus(ctx, errPrefix+"logs of workload "+req.WorkloadID, err)
		}
		if _, err := w.Write(chunk.GetData()); err != nil {
			return err
		}
	}
}

// Stats implements StatsReporter.
func (c *Client) Stats(ctx context.Context, req *StatsRequest) (*Stats, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Stats(ctx, &runtimev1.StatsRequest{WorkloadId: req.WorkloadID})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"stats of workload "+req.WorkloadID, err)
	}
	out := &Stats{CPUSeconds: r.GetCpuSeconds(), MemoryBytes: r.GetMemoryBytes()}
	if r.GetAt() != nil {
		out.At = r.GetAt().AsTime()
	}
	return out, nil
}

// MutationToProto converts the mutation fields to their wire form.
func MutationToProto(m pluginapi.Mutation) *pluginv1.Mutation {
	return &pluginv1.Mutation{OperationId: m.OperationID, IdempotencyKey: m.IdempotencyKey, FencingToken: m.FencingToken}
}

// MutationFromProto converts wire mutation fields back; nil gives the zero Mutation.
func MutationFromProto(m *pluginv1.Mutation) pluginapi.Mutation {
	return pluginapi.Mutation{OperationID: m.GetOperationId(), IdempotencyKey: m.GetIdempotencyKey(), FencingToken: m.GetFencingToken()}
}

func handleToProto(h Handle) *runtimev1.Handle {
	if h.IsZero() {
		return nil
	}
	return &runtimev1.Handle{Version: int32(h.Version), Data: h.Data}
}

func handleFromProto(h *runtimev1.Handle) Handle {
	return Handle{Version: int(h.GetVersion()), Data: h.GetData()}
}

// StateToProto converts a workload state to its wire form; nil stays nil.
func StateToProto(s *WorkloadState) *runtimev1.WorkloadState {
	if s == nil {
		return nil
	}
	out := &runtimev1.WorkloadState{
		WorkloadId: s.WorkloadID,
		State:      s.State,
		Pid:        int64(s.PID),
		ExitCode:   int32(s.ExitCode),
		Handle:     handleToProto(s.Handle),
		ExitReason: s.ExitReason,
	}
	if !s.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(s.StartedAt)
	}
	if !s.ExitedAt.IsZero() {
		out.ExitedAt = timestamppb.New(s.ExitedAt)
	}
	return out
}

// StateFromProto converts a wire workload state back; nil stays nil.
func StateFromProto(s *runtimev1.WorkloadState) *WorkloadState {
	if s == nil {
		return nil
	}
	out := &WorkloadState{
		WorkloadID: s.GetWorkloadId(),
		State:      s.GetState(),
		PID:        int(s.GetPid()),
		ExitCode:   int(s.GetExitCode()),
		Handle:     handleFromProto(s.GetHandle()),
		ExitReason: s.GetExitReason(),
	}
	if s.GetStartedAt() != nil {
		out.StartedAt = s.GetStartedAt().AsTime()
	}
	if s.GetExitedAt() != nil {
		out.ExitedAt = s.GetExitedAt().AsTime()
	}
	return out
}

func credentialsFromProto(in []*runtimev1.RegistryCredential) []RegistryCredential {
	var out []RegistryCredential
	for _, c := range in {
		out = append(out, RegistryCredential{Host: c.GetHost(), Username: c.GetUsername(), Secret: c.GetSecret(),
			Fingerprint: c.GetFingerprint(), PlainHTTP: c.GetPlainHttp()})
	}
	return out
}

func credentialsToProto(in []RegistryCredential) []*runtimev1.RegistryCredential {
	var out []*runtimev1.RegistryCredential
	for _, c := range in {
		out = append(out, &runtimev1.RegistryCredential{Host: c.Host, Username: c.Username, Secret: c.Secret,
			Fingerprint: c.Fingerprint, PlainHttp: c.PlainHTTP})
	}
	return out
}
