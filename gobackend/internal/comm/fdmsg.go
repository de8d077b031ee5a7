package comm

import "golang.org/x/sys/unix"

// FDMsg is what one rank announced in an fd exchange over the links: a
// body and the fds it attached.
type FDMsg struct {
	OK   bool // it attached fds
	Body []byte
	FDs  []int // received (none for this rank's own entry); -1 once taken
}

// FD is the first fd received, or -1.
func (m *FDMsg) FD() int {
	if len(m.FDs) == 0 {
		return -1
	}
	return m.FDs[0]
}

// Take hands the first fd over to the caller (-1: none).
func (m *FDMsg) Take() int {
	fd := m.FD()
	if fd >= 0 {
		m.FDs[0] = -1
	}
	return fd
}

// OneFD is fd as an announcement's list (-1: none).
func OneFD(fd int) []int {
	if fd < 0 {
		return nil
	}
	return []int{fd}
}

// CloseFDs closes the fds an exchange returned.
func CloseFDs(msgs []FDMsg) {
	for i := range msgs {
		for j, fd := range msgs[i].FDs {
			if fd >= 0 {
				unix.Close(fd)
				msgs[i].FDs[j] = -1
			}
		}
	}
}
