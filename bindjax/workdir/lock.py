"""One owner per workdir: the lock a training run holds on its workdir for its whole life.

`bindjax sweep` and `bindjax train` take WORKDIR/bindjax.lock before they change anything in
the workdir (on a multi-host run the writer process takes it) and give it back when they end. The
lock is an exclusive `flock` on that file, which also names its holder (host, pid, start time,
command); the kernel drops a flock when its process dies, however it dies, so a lock left by a
killed run is recognised as stale and taken over, and the run says so. A second run on a live
workdir is refused at once with `WorkdirLockedError` naming the holder. Readers (`bindjax
report`, `bindjax extract`, the analyses) never take the lock: they read a live workdir as it is.

Where the file system offers no flock, the lock falls back to the holder's record: a holder on
this host that no longer runs is stale; one on another host cannot be checked, and the run is
refused with the path of the lock file to remove once that run is known to be gone.

A workdir that is not local (gs://, any non-local `etils.epath` path) offers neither flock nor
an atomic create, so there the lock is the record alone, judged the same way: a run refuses a
workdir whose record names a live run (or one on another host), writes its own record and reads
it back, refusing if another run's record replaced it. Two runs that start at the same moment
can still both pass; a run that dies leaves its record, which a later run on the same host
recognises as stale and one on another host asks the user to remove.
"""
import datetime
import errno
import fcntl
import json
import os
import socket
import sys

from bindjax.base import files
from bindjax.workdir import layout



class WorkdirLockedError(OSError):
  """The workdir is held by another live run."""


def _process_start(pid):
  """The start time of process `pid` in clock ticks since boot (None where /proc lacks it); with
  the pid it tells a live holder from a later process that reuses its pid."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def describe(holder):
  if not holder:
    return "a run that is just starting"
  command = holder.get("command", "")
  command = command if len(command) <= 80 else command[:79] + "…"
  return (f"pid {holder.get('pid')} on host {holder.get('host')}, started "
          f"{holder.get('started')}" + (f" ({command})" if command else ""))


def _parse_holder(data):
  """The holder a lock file's bytes name (None when they name none)."""
  try:
    holder = json.loads(data.decode()) if data.strip() else None
  except ValueError:
    return None
  return holder if isinstance(holder, dict) else None


def _read_holder(fd):
  try:
    return _parse_holder(os.pread(fd, 1 << 16, 0))
  except OSError:
    return None


def _record():
  """The lock file's bytes naming this process as the holder."""
  return json.dumps({
      "host": socket.gethostname(), "pid": os.getpid(),
      "process_start": _process_start(os.getpid()),
      "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
      "command": " ".join(sys.argv)}).encode()


def _holder_alive(holder):
  """Whether the holder a lock file names still runs (True when that cannot be told)."""
  if holder.get("host") != socket.gethostname():
    return True
  pid = holder.get("pid")
  if not isinstance(pid, int):
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  start = _process_start(pid)
  return start is None or holder.get("process_start") in (None, start)


class WorkdirLock:
  """An acquired lock; `release()` (or leaving the `with` block) gives it back.

  `stale` is the record of the dead run whose lock was taken over (None when there was none).
  """

  def __init__(self, path, fd, stale, created_directory, record=None):
    self.path = path
    self.stale = stale
    self._fd = fd
    self._record = record
    self._created_directory = created_directory
    self._held = True

  def release(self):
    """Removes the lock file, then unlocks (a waiting run re-checks which file it locked). A
    workdir this lock created and nothing else filled is removed too, so a refused run leaves
    nothing behind. Without a flock (a non-local workdir) the file is removed only while it
    still holds this run's record."""
    if not self._held:
      return
    self._held = False
    if self._fd is None:
      _remove_own_record(files.as_path(self.path), self._record)
      return
    try:
      if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
        os.remove(self.path)
    except FileNotFoundError:
      pass
    os.close(self._fd)
    self._fd = None
    directory = os.path.dirname(self.path)
    if self._created_directory and not os.listdir(directory):
      os.rmdir(directory)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.release()


def acquire(workdir):
  """Takes the lock of `workdir` (created if needed); returns a WorkdirLock.

  Raises WorkdirLockedError naming the holder when a live run holds it, and OSError naming the
  workdir when it cannot be written.
  """
  if not files.is_local(workdir):
    return _acquire_record(files.as_path(workdir))
  workdir = os.path.abspath(os.fspath(workdir))
  path = os.fspath(layout.Workdir(workdir).lock_file)
  created = not os.path.isdir(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
    while True:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
      holder = _read_holder(fd)
      if not _lock(fd, holder, path):
        holder = _read_holder(fd) or holder
        os.close(fd)
        if created and not os.listdir(workdir):
          os.rmdir(workdir)
        raise WorkdirLockedError(f"workdir {workdir} is in use by another run: {describe(holder)};"
                                 " wait for it to end or use another --workdir")
      try:
        same_file = os.stat(path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same_file = False
      if same_file:
        break
      os.close(fd)   # its previous holder removed the file while we waited for it; again
    data = _record()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
  except WorkdirLockedError:
    raise
  except OSError as e:
    raise OSError(e.errno, f"cannot write to workdir {workdir}: {e.strerror}") from None
  return WorkdirLock(path, fd, holder, created)


def _lock(fd, holder, path):
  """Whether this process now holds the flock of `fd`."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except BlockingIOError:
    return False
  except OSError as e:
    if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
      raise
  return _free_by_record(holder, path)


def _free_by_record(holder, path):
  """Whether a lock judged by its holder's record alone may be taken: no holder, or one on this
  host that no longer runs. WorkdirLockedError for a holder on another host (it cannot be
  checked from here)."""
  if holder is None or not _holder_alive(holder):
    return True
  if holder.get("host") != socket.gethostname():
    raise WorkdirLockedError(f"{path}: held by {describe(holder)}, which this host cannot "
                             "check (the file system has no locks); remove the file once that "
                             "run has ended")
  return False


def _acquire_record(workdir):
  """`acquire` on a non-local workdir: by the holder's record alone (the module's docstring
  says what that guarantees)."""
  path = layout.Workdir(workdir).lock_file
  try:
    holder = _parse_holder(path.read_bytes()) if path.exists() else None
    if not _free_by_record(holder, path):
      raise WorkdirLockedError(f"workdir {workdir} is in use by another run: {describe(holder)};"
                               " wait for it to end or use another --workdir")
    data = _record()
    path.write_bytes(data)
    if path.read_bytes() != data:
      raise WorkdirLockedError(f"workdir {workdir} was taken by another run starting at the "
                               f"same time: {describe(_parse_holder(path.read_bytes()))}")
  except WorkdirLockedError:
    raise
  except OSError as e:
    raise OSError(e.errno, f"cannot write to workdir {workdir}: {e.strerror or e}") from None
  return WorkdirLock(os.fspath(path), None, holder, False, data)


def _remove_own_record(path, record):
  """Removes the lock file at `path` if it still holds `record`."""
  try:
    if path.read_bytes() == record:
      path.unlink()
  except FileNotFoundError:
    pass
