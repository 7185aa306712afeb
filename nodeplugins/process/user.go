package process

import (
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// credential returns the identity a workload of StartRequest.User runs as (docs/plugins.md
// section 3, "User"): nil for "" (the driver's own user); otherwise "uid", "uid:gid" (numbers)
// or a user name of this host, with no supplementary groups. A "uid" alone takes that user's
// primary group when the host knows it, else the gid equal to the uid. An unknown name or a
// malformed value is an error wrapping [ErrInvalidRequest].
func credential(spec string) (*syscall.Credential, error) {
	if spec == "" {
		return nil, nil
	}
	name, group, hasGroup := strings.Cut(spec, ":")
	uid, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		if hasGroup {
			return nil, fmt.Errorf("user %q: want uid, uid:gid or a user name: %w", spec, ErrInvalidRequest)
		}
		u, err := user.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("user %q: %w: %w", spec, err, ErrInvalidRequest)
		}
		return parseIDs(u.Uid, u.Gid, spec)
	}
	if hasGroup {
		return parseIDs(name, group, spec)
	}
	gid := strconv.FormatUint(uid, 10)
	if u, err := user.LookupId(name); err == nil {
		gid = u.Gid
	}
	return parseIDs(name, gid, spec)
}

func parseIDs(uid, gid, spec string) (*syscall.Credential, error) {
	u, err1 := strconv.ParseUint(uid, 10, 32)
	g, err2 := strconv.ParseUint(gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q: want uid, uid:gid or a user name: %w", spec, ErrInvalidRequest)
	}
	return &syscall.Credential{Uid: uint32(u), Gid: uint32(g), Groups: []uint32{}}, nil
}
