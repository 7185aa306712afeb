package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/berthhq/berth/core/blobs"
)

// openBlobs returns berthd's blob store: the filesystem under
// DataDir/blobs, or, when cfg.S3 names an endpoint, that bucket with the
// local directory as a read fallback while a background pass moves what it
// still holds (docs/operating.md section 10). The returned stop ends that
// pass and waits for it.
func openBlobs(ctx context.Context, cfg Config, log *slog.Logger) (store blobs.Store, stop func(), err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	local, err := blobs.NewFS(filepath.Join(cfg.DataDir, "blobs"))
	if err != nil {
		return nil, nil, err
	}
	if cfg.S3.Endpoint == "" {
		return local, func() {}, nil
	}
	s3cfg := cfg.S3
	s3cfg.Logger = log
	s3, err := blobs.NewS3(s3cfg)
	if err != nil {
		return nil, nil, err
	}
	log.Info("blob store: S3", "endpoint", s3cfg.Endpoint, "bucket", s3cfg.Bucket, "region", s3cfg.Region)
	served, stop := blobs.StartMigration(ctx, local, s3, log)
	return served, stop, nil
}

// checkS3Config refuses an incomplete S3 configuration.
func checkS3Config(c blobs.S3Config) error {
	if c.Endpoint == "" && (c.Bucket != "" || c.Region != "" || c.CredentialsFile != "") {
		return fmt.Errorf("berthd: --s3-bucket, --s3-region and --s3-credentials-file need --s3-endpoint")
	}
	if c.Endpoint != "" && c.Bucket == "" {
		return fmt.Errorf("berthd: --s3-endpoint needs --s3-bucket")
	}
	return nil
}
