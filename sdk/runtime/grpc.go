package runtime

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	runtimev1 "github.com/berthhq/berth/abi/proto/runtime/v1"
)

// grpcServer serves a Driver as the RuntimeDriver gRPC service.
type grpcServer struct {
	runtimev1.UnimplementedRuntimeDriverServer
	impl Driver
}

func (s *grpcServer) Describe(ctx context.Context, _ *runtimev1.DescribeRequest) (*runtimev1.DescribeResponse, error) {
	r, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	if r == nil {
		return nil, status.Error(codes.Internal, "runtime driver: Describe returned no response")
	}
	out := &runtimev1.DescribeResponse{
		Name:    r.Name,
		Version: r.Version,
		Capabilities: &runtimev1.Capabilities{
			OutlivesDriver: r.Capabilities.OutlivesDriver,
			Isolation:      r.Capabilities.Isolation,
		},
	}
	for _, v := range r.APIVersions {
		out.ApiVersions = append(out.ApiVersions, int32(v))
	}
	return out, nil
}

func (s *grpcServer) Start(ctx context.Context, req *runtimev1.StartRequest) (*runtimev1.StartResponse, error) {
	r, err := s.impl.Start(ctx, &StartRequest{
		WorkloadID:  req.GetWorkloadId(),
		Command:     req.GetCommand(),
		Env:         req.GetEnv(),
		WorkDir:     req.GetWorkDir(),
		LogPath:     req.GetLogPath(),
		LogMaxBytes: req.GetLogMaxBytes(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	if r == nil {
		return &runtimev1.StartResponse{}, nil
	}
	return &runtimev1.StartResponse{State: stateToProto(r.State)}, nil
}

func (s *grpcServer) Stop(ctx context.Context, req *runtimev1.StopRequest) (*runtimev1.StopResponse, error) {
	in := &StopRequest{WorkloadID: req.GetWorkloadId(), Force: req.GetForce()}
	if req.GetTimeout() != nil {
		in.Timeout = req.GetTimeout().AsDuration()
	}
	r, err := s.impl.Stop(ctx, in)
	if err != nil {
		return nil, toStatus(err)
	}
	if r == nil {
		return &runtimev1.StopResponse{}, nil
	}
	return &runtimev1.StopResponse{State: stateToProto(r.State)}, nil
}

func (s *grpcServer) Inspect(ctx context.Context, req *runtimev1.InspectRequest) (*runtimev1.InspectResponse, error) {
	r, err := s.impl.Inspect(ctx, &InspectRequest{WorkloadID: req.GetWorkloadId()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtimev1.InspectResponse{State: stateToProto(r)}, nil
}

func (s *grpcServer) List(ctx context.Context, _ *runtimev1.ListRequest) (*runtimev1.ListResponse, error) {
	r, err := s.impl.List(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &runtimev1.ListResponse{Workloads: make([]*runtimev1.WorkloadState, 0, len(r))}
	for _, w := range r {
		if w != nil {
			out.Workloads = append(out.Workloads, stateToProto(w))
		}
	}
	return out, nil
}

// GRPCClient is the host side of a driver plugin: it implements Driver over
// the RuntimeDriver gRPC service. Every call runs under the caller's ctx joined
// with the plugin's lifetime, so calls in flight fail at once when the plugin
// process exits. Errors from the plugin that wrap ErrNotFound come back wrapping
// ErrNotFound; context errors come back as context.Canceled or
// context.DeadlineExceeded. Safe for concurrent use.
type GRPCClient struct {
	life   context.Context
	client runtimev1.RuntimeDriverClient
}

var _ Driver = (*GRPCClient)(nil)

// NewGRPCClient returns a client over conn. life is the plugin's lifetime
// context (go-plugin cancels it when the process exits); nil means none.
func NewGRPCClient(life context.Context, conn grpc.ClientConnInterface) *GRPCClient {
	if life == nil {
		life = context.Background()
	}
	return &GRPCClient{life: life, client: runtimev1.NewRuntimeDriverClient(conn)}
}

// Done returns a channel closed when the plugin process has exited.
func (c *GRPCClient) Done() <-chan struct{} { return c.life.Done() }

// join returns ctx cancelled also when the plugin's lifetime ends.
func (c *GRPCClient) join(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.life, func() { cancel(errPluginExited) })
	return ctx, func() { stop(); cancel(context.Canceled) }
}

var errPluginExited = errors.New("berth: runtime driver plugin exited")

// Describe implements Driver.
func (c *GRPCClient) Describe(ctx context.Context) (*DescribeResponse, error) {
	ctx, cancel := c.join(ctx)
	defer cancel()
	r, err := c.client.Describe(ctx, &runtimev1.DescribeRequest{})
	if err != nil {
		return nil, fromStatus(ctx, "describe", err)
	}
	out := &DescribeResponse{Name: r.GetName(), Version: r.GetVersion()}
	for _, v := range r.GetApiVersions() {
		out.APIVersions = append(out.APIVersions, int(v))
	}
	if cp := r.GetCapabilities(); cp != nil {
		out.Capabilities = Capabilities{OutlivesDriver: cp.GetOutlivesDriver(), Isolation: cp.GetIsolation()}
	}
	return out, nil
}

// Start implements Driver.
func (c *GRPCClient) Start(ctx context.Context, req *StartRequest) (*StartResponse, error) {
	ctx, cancel := c.join(ctx)
	defer cancel()
	r, err := c.client.Start(ctx, &runtimev1.StartRequest{
		WorkloadId:  req.WorkloadID,
		Command:     req.Command,
		Env:         req.Env,
		WorkDir:     req.WorkDir,
		LogPath:     req.LogPath,
		LogMaxBytes: req.LogMaxBytes,
	})
	if err != nil {
		return nil, fromStatus(ctx, "start workload "+req.WorkloadID, err)
	}
	return &StartResponse{State: stateFromProto(r.GetState())}, nil
}

// Stop implements Driver.
func (c *GRPCClient) Stop(ctx context.Context, req *StopRequest) (*StopResponse, error) {
	ctx, cancel := c.join(ctx)
	defer cancel()
	in := &runtimev1.StopRequest{WorkloadId: req.WorkloadID, Force: req.Force}
	if req.Timeout != 0 {
		in.Timeout = durationpb.New(req.Timeout)
	}
	r, err := c.client.Stop(ctx, in)
	if err != nil {
		return nil, fromStatus(ctx, "stop workload "+req.WorkloadID, err)
	}
	return &StopResponse{State: stateFromProto(r.GetState())}, nil
}

// Inspect implements Driver.
func (c *GRPCClient) Inspect(ctx context.Context, req *InspectRequest) (*WorkloadState, error) {
	ctx, cancel := c.join(ctx)
	defer cancel()
	r, err := c.client.Inspect(ctx, &runtimev1.InspectRequest{WorkloadId: req.WorkloadID})
	if err != nil {
		return nil, fromStatus(ctx, "inspect workload "+req.WorkloadID, err)
	}
	return stateFromProto(r.GetState()), nil
}

// List implements Driver.
func (c *GRPCClient) List(ctx context.Context) ([]*WorkloadState, error) {
	ctx, cancel := c.join(ctx)
	defer cancel()
	r, err := c.client.List(ctx, &runtimev1.ListRequest{})
	if err != nil {
		return nil, fromStatus(ctx, "list workloads", err)
	}
	out := make([]*WorkloadState, 0, len(r.GetWorkloads()))
	for _, w := range r.GetWorkloads() {
		out = append(out, stateFromProto(w))
	}
	return out, nil
}

// RemoteError is an error returned by a plugin, carried over gRPC. Error is
// the plugin's message; Unwrap returns the sentinel its gRPC code maps to
// (ErrNotFound for NotFound), or nil.
type RemoteError struct {
	Code     codes.Code
	Message  string
	sentinel error
}

// Error returns the plugin's message.
func (e *RemoteError) Error() string { return e.Message }

// Unwrap returns the sentinel the gRPC code maps to, or nil.
func (e *RemoteError) Unwrap() error { return e.sentinel }

// GRPCStatus lets status.FromError recover the code.
func (e *RemoteError) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// toStatus maps a driver error to a gRPC status: ErrNotFound to NotFound and
// context errors to Canceled and DeadlineExceeded; anything else is Unknown.
func toStatus(err error) error {
	switch {
	case errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// fromStatus maps a gRPC error back: NotFound wraps ErrNotFound; a call cut
// short by ctx (the caller's, or the plugin's exit) returns ctx's cause.
func fromStatus(ctx context.Context, what string, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("runtime driver: %s: %w", what, cause)
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("runtime driver: %s: %w", what, err)
	}
	re := &RemoteError{Code: st.Code(), Message: st.Message()}
	switch st.Code() {
	case codes.NotFound:
		re.sentinel = ErrNotFound
	case codes.Canceled:
		re.sentinel = context.Canceled
	case codes.DeadlineExceeded:
		re.sentinel = context.DeadlineExceeded
	}
	return fmt.Errorf("runtime driver: %s: %w", what, re)
}

func stateToProto(s *WorkloadState) *runtimev1.WorkloadState {
	if s == nil {
		return nil
	}
	out := &runtimev1.WorkloadState{
		WorkloadId: s.WorkloadID,
		State:      s.State,
		Pid:        int64(s.PID),
		ExitCode:   int32(s.ExitCode),
	}
	if !s.StartedAt.IsZero() {
		out.StartedAt = timestamppb.New(s.StartedAt)
	}
	if !s.ExitedAt.IsZero() {
		out.ExitedAt = timestamppb.New(s.ExitedAt)
	}
	return out
}

func stateFromProto(s *runtimev1.WorkloadState) *WorkloadState {
	if s == nil {
		return nil
	}
	out := &WorkloadState{
		WorkloadID: s.GetWorkloadId(),
		State:      s.GetState(),
		PID:        int(s.GetPid()),
		ExitCode:   int(s.GetExitCode()),
	}
	if s.GetStartedAt() != nil {
		out.StartedAt = s.GetStartedAt().AsTime()
	}
	if s.GetExitedAt() != nil {
		out.ExitedAt = s.GetExitedAt().AsTime()
	}
	return out
}
