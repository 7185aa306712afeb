package placement_test

import "github.com/berthhq/berth/core/runners"

// placementFits accepts any node with units free (a reservation made by hand in a test).
func placementFits(units int) runners.Fits {
	return func(n *runners.Node, reserved int, _ runners.Reservation) bool { return n.Capacity-reserved >= units }
}
