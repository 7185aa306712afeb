package hetzner

import (
	"context"
	"errors"
	"fmt"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// codeOf maps an hcloud API error code to the Berth code it becomes
// (docs/plugins-hetzner.md section 6).
func codeOf(c hcloud.ErrorCode) abierrors.Code {
	switch c {
	case hcloud.ErrorCodeInvalidInput, hcloud.ErrorCodeJSONError, hcloud.ErrorCodeInvalidServerType:
		return abierrors.ProviderInvalidInput
	case hcloud.ErrorCodeForbidden, hcloud.ErrorCodeUnauthorized, hcloud.ErrorCodeProtected:
		return abierrors.ProviderForbidden
	case hcloud.ErrorCodeResourceLimitExceeded:
		return abierrors.ProviderResourceLimitExceeded
	case hcloud.ErrorCodeResourceUnavailable:
		return abierrors.ProviderResourceUnavailable
	case hcloud.ErrorCodePlacementError:
		return abierrors.ProviderPlacementError
	case hcloud.ErrorCodeLocked, hcloud.ErrorCodeResourceLocked:
		return abierrors.ProviderLocked
	case hcloud.ErrorCodeNotFound:
		return abierrors.NotFound
	case hcloud.ErrorCodeUniquenessError:
		return abierrors.ProviderNameTaken
	}
	// server_error, service_error, timeout, bad_gateway, maintenance,
	// conflict, rate_limit_exceeded and anything new: worth a retry.
	return abierrors.Unavailable
}

// apiErr turns an error of an hcloud call into one with a stable code that
// says what was being done. A context's end stays matchable with errors.Is.
func apiErr(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("hetzner: %s: %w", what, err)
	}
	var he hcloud.Error
	if errors.As(err, &he) {
		return abierrors.Wrap(codeOf(he.Code), fmt.Sprintf("hetzner: %s: the API answered %s: %s", what, he.Code, he.Message), err)
	}
	var ce *abierrors.Error
	if errors.As(err, &ce) {
		return err
	}
	return abierrors.Wrap(abierrors.Unavailable, fmt.Sprintf("hetzner: %s: the API could not be reached", what), err)
}
