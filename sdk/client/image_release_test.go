package client_test

import (
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestReleaseFollowSummary: the FOLLOW column of berth release list for each state.
func TestReleaseFollowSummary(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		f    *client.ReleaseFollow
		want string
	}{
		{nil, ""},
		{&client.ReleaseFollow{State: client.FollowPending, Reason: "conflict"}, "pending"},
		{&client.ReleaseFollow{State: client.FollowFollowed}, "followed"},
		{&client.ReleaseFollow{State: client.FollowRefused, Reason: "policy: pushed images wait for review"}, "refused(policy)"},
		{&client.ReleaseFollow{State: client.FollowRefused}, "refused"},
		{&client.ReleaseFollow{State: client.FollowFailed, Reason: "services store unreachable"}, "failed(services store unreachable)"},
	} {
		if got := c.f.Summary(); got != c.want {
			t.Errorf("Summary of %+v = %q, want %q", c.f, got, c.want)
		}
	}
}
