package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/bundle"
)

// progressMin is the upload size from which a progress line is printed.
const progressMin = 8 << 20

func newBundleCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bundle push DIR|FILE",
		RunE:  groupRunE,
		Short: "Manage release bundles",
	}
	var name string
	push := &cobra.Command{
		Use:   "push DIR|FILE [--name NAME]",
		Short: "Upload a release bundle",
		Long: `push uploads a release bundle to the project. A directory (or a single file
that is not a .tar.gz) is packed first into a reproducible tar.gz: the same
tree always gives the same digest. An existing .tar.gz or .tgz file is checked
and uploaded as is. With --name, services can refer to the bundle by that
name instead of its digest. It prints the digest and the size.`,
		Example: `  berth bundle push ./build --name hello
  berth bundle push release.tar.gz --project shop`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			src := args[0]
			info, err := os.Stat(src)
			if err != nil {
				return fmt.Errorf("bundle push: %w", err)
			}
			var f *os.File
			if info.Mode().IsRegular() && (strings.HasSuffix(src, ".tar.gz") || strings.HasSuffix(src, ".tgz")) {
				f, err = os.Open(src)
				if err != nil {
					return fmt.Errorf("bundle push: %w", err)
				}
				defer f.Close()
				if err := bundle.Validate(ctx, f, 0); err != nil {
					return fmt.Errorf("bundle push %s: %w", src, err)
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return fmt.Errorf("bundle push: %w", err)
				}
			} else {
				f, err = os.CreateTemp("", "berth-bundle-*.tar.gz")
				if err != nil {
					return fmt.Errorf("bundle push: %w", err)
				}
				defer os.Remove(f.Name())
				defer f.Close()
				if _, _, err := bundle.Create(ctx, src, f); err != nil {
					return fmt.Errorf("bundle push: %w", err)
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return fmt.Errorf("bundle push: %w", err)
				}
			}
			st, err := f.Stat()
			if err != nil {
				return fmt.Errorf("bundle push: %w", err)
			}
			up := &uploadReader{r: f, h: sha256.New(), total: st.Size(), w: a.stderr}
			b, err := c.PushBundle(ctx, s.Project, name, up)
			if err != nil {
				return fmt.Errorf("bundle push %s: %w", src, err)
			}
			local := "sha256:" + hex.EncodeToString(up.h.Sum(nil))
			if b.Digest != local {
				return fmt.Errorf("bundle push %s: the server stored digest %s, but the upload hashes to %s", src, b.Digest, local)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, b)
			}
			fmt.Fprintf(a.stdout, "pushed %s (%s) to project %s", b.Digest, humanBytes(b.Size), s.Project)
			if b.Name != "" {
				fmt.Fprintf(a.stdout, " as %s", b.Name)
			}
			fmt.Fprintln(a.stdout)
			return nil
		},
	}
	push.Flags().StringVar(&name, "name", "", "name services can use instead of the digest")
	cmd.AddCommand(push)
	return cmd
}

// uploadReader hashes what is read through it and, for large uploads, prints
// a progress line at every tenth. Len reports the bytes left, so the API
// client sends a Content-Length.
type uploadReader struct {
	r     io.Reader
	h     hash.Hash
	total int64
	done  int64
	shown int64 // last tenth printed
	w     io.Writer
}

func (u *uploadReader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if n > 0 {
		u.h.Write(p[:n])
		u.done += int64(n)
		if u.total >= progressMin {
			if tenth := u.done * 10 / u.total; tenth > u.shown {
				u.shown = tenth
				fmt.Fprintf(u.w, "uploading: %3d%% (%s of %s)\n", tenth*10, humanBytes(u.done), humanBytes(u.total))
			}
		}
	}
	return n, err
}

// Len reports the bytes not yet read.
func (u *uploadReader) Len() int { return int(u.total - u.done) }
