package services

import "errors"

// ErrNotContainer is returned for a service whose runtime is not "containerd" where an image is
// set (a release promotion): it runs no image.
var ErrNotContainer = errors.New("berth: service runs no container image")
