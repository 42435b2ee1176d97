package cpu

import "golang.org/x/sys/unix"

// adviseHugePages asks Linux to back b, which nothing has touched yet, with
// transparent huge pages (MADV_HUGEPAGE: honoured under the THP settings
// "always" and "madvise"). Advice the kernel refuses changes nothing else.
func adviseHugePages(b []byte) {
	if len(b) > 0 {
		_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	}
}
