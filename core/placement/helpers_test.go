package placement_test

import "github.com/berthhq/berth/core/scheduler"

func placementDemand(units int) scheduler.Demand { return scheduler.Demand{Units: units} }
