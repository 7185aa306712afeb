package pluginapi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of Berth plugin errors.
const ErrorDomain = "berth.plugin"

// grpcCode maps a stable code to the gRPC code that carries it.
func grpcCode(c abierrors.Code) codes.Code {
	switch c {
	case abierrors.NotFound, abierrors.ProjectNotFound, abierrors.ServiceNotFound, abierrors.NodeNotFound, abierrors.BundleNotFound:
		return codes.NotFound
	case abierrors.BadRequest, abierrors.ValidationFailed, abierrors.InvalidName:
		return codes.InvalidArgument
	case abierrors.AlreadyExists, abierrors.IdempotencyKeyReused:
		return codes.AlreadyExists
	case abierrors.StaleFencingToken, abierrors.RevisionConflict:
		return codes.FailedPrecondition
	case abierrors.Unavailable:
		return codes.Unavailable
	case abierrors.Unimplemented:
		return codes.Unimplemented
	case abierrors.Internal:
		return codes.Internal
	}
	return codes.Unknown
}

// codeOf maps a gRPC code without an ErrorInfo back to a stable code.
func codeOf(c codes.Code) abierrors.Code {
	switch c {
	case codes.NotFound:
		return abierrors.NotFound
	case codes.InvalidArgument:
		return abierrors.ValidationFailed
	case codes.AlreadyExists:
		return abierrors.AlreadyExists
	case codes.Unavailable:
		return abierrors.Unavailable
	case codes.Unimplemented:
		return abierrors.Unimplemented
	}
	return abierrors.Internal
}

// ToStatus converts an error returned by a plugin implementation into the
// gRPC status error that carries it: an *abi/errors.Error keeps its code in a
// google.rpc.ErrorInfo (reason = the code); context errors become Canceled
// and DeadlineExceeded; anything else is Internal with code "internal". The
// message is err's text. nil stays nil.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	code := abierrors.CodeOf(err)
	st := status.New(grpcCode(code), err.Error())
	if withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: string(code), Domain: ErrorDomain}); derr == nil {
		st = withInfo
	}
	return st.Err()
}

// FromStatus converts an error of a gRPC call to a plugin back, prefixed with
// what was being done:
//
//   - a call cut short by ctx (the caller's deadline or cancellation, or the
//     plugin's exit as joined by [Join]) wraps ctx's cause;
//   - a status with a Berth ErrorInfo becomes an *abi/errors.Error with that
//     code and the plugin's message, so errors.Is against a sentinel of the
//     same code holds;
//   - Canceled and DeadlineExceeded wrap the context errors;
//   - other statuses map by gRPC code (NotFound, InvalidArgument,
//     Unimplemented, Unavailable), anything else to code "internal".
func FromStatus(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("%s: %w", what, cause)
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%s: %s: %w", what, st.Message(), context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %s: %w", what, st.Message(), context.DeadlineExceeded)
	}
	code := codeOf(st.Code())
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() != "" {
			code = abierrors.Code(info.GetReason())
		}
	}
	// The plugin's text of an *abi/errors.Error starts with its code, which
	// the returned error prints again.
	msg := strings.TrimPrefix(st.Message(), string(code)+": ")
	return fmt.Errorf("%s: %w", what, &abierrors.Error{Code: code, Message: msg})
}

// IsUnimplemented reports whether err says the plugin does not implement the
// call (an optional interface it lacks).
func IsUnimplemented(err error) bool {
	return abierrors.CodeOf(err) == abierrors.Unimplemented
}

// ErrUnimplemented is returned (wrapped) for an optional call a plugin does
// not implement; errors.Is matches any error of code "unimplemented".
var ErrUnimplemented = abierrors.New(abierrors.Unimplemented, "not implemented by this plugin")

// ErrStaleFencingToken matches, with errors.Is, any refusal of a stale
// fencing token (code "stale_fencing_token").
var ErrStaleFencingToken = abierrors.New(abierrors.StaleFencingToken, "fencing token lower than the highest seen")
