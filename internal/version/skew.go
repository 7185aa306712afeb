package version

import (
	"errors"
	"fmt"
)

// MaxMinorsBehind is how many minor versions an agent or node plugin may run
// behind berthd (docs/upgrades.md section 2): berthd 0.4.x accepts agents
// 0.3.x and 0.4.x.
const MaxMinorsBehind = 1

// ErrSkew is returned (wrapped) by [CheckSkew] when a component's version is
// outside the skew berthd accepts; the session refuses such an agent with the
// fatal code agent_version_skew (docs/node-protocol.md section 4.2).
var ErrSkew = errors.New("berth: version outside the supported skew")

// CheckSkew applies the skew rule of docs/upgrades.md section 2 to a
// component (an agent or node plugin) at version peer talking to berthd at
// version core:
//
//   - same major version;
//   - the peer's minor is the core's, or at most [MaxMinorsBehind] less;
//   - patch releases of one minor mix freely, either way.
//
// It returns nil when either side is a development build ([IsDev]), an error
// wrapping [ErrInvalid] when peer or core is not a semantic version, and an
// error wrapping [ErrSkew] that says which side to upgrade otherwise.
func CheckSkew(core, peer string) error {
	if IsDev(core) || IsDev(peer) {
		return nil
	}
	c, err := Parse(core)
	if err != nil {
		return fmt.Errorf("core %w", err)
	}
	p, err := Parse(peer)
	if err != nil {
		return err
	}
	switch {
	case p.Major != c.Major:
		return fmt.Errorf("%s against berthd %s: major versions differ: %w", peer, core, ErrSkew)
	case p.Minor > c.Minor:
		return fmt.Errorf("%s is newer than berthd %s; upgrade berthd first: %w", peer, core, ErrSkew)
	case c.Minor-p.Minor > MaxMinorsBehind:
		return fmt.Errorf("%s is more than %d minor version behind berthd %s; upgrade it before berthd: %w", peer, MaxMinorsBehind, core, ErrSkew)
	}
	return nil
}
