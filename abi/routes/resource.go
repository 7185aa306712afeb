package routes

// The route table as a provider resource (docs/plugins.md section 5): berthd
// applies the whole table as one resource of type ResourceType and id
// ResourceID, with the table's JSON form as attributes.
const (
	ResourceType = "gateway.route_table"
	ResourceID   = "default"
)
