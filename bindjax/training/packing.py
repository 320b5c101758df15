"""Which devices train which replicas: a sweep's buckets packed onto lanes of the mesh.

A bucket's replicas train in one program whose replica axis is split over the device groups
of a mesh (`parallel.make_mesh`: groups of `num_data` devices), padded to a multiple of them.
Run one after another over every device, buckets whose size is not a multiple of the groups
leave the padding's slots idle: the paper grid's 27-replica buckets fill 84% of 8 devices and
42% of 64. A *plan* splits the devices into equal, disjoint *lanes*, each a mesh of its own, and
deals the replicas, in grid order, onto the lanes as contiguous *parts* (a part is a run of one
bucket's replicas, so one program), each lane training its parts one after another while the
lanes run side by side.

Time is counted in a replica-step cost per bucket (`costs`: train FLOPs per step × steps): a
part of n replicas on a lane with g groups of d devices takes ceil(n / g) rounds of cost / d,
that is, a device group is assumed full with one replica per round, and a replica split over d
devices is assumed d times faster. *Slot use* is the replicas' total cost over (devices ×
the plan's makespan): the fraction of device time that trains a replica rather than padding or
waiting. On several processes every lane takes an equal share of every process's devices, so
every process takes part in every program and process 0 receives every row.
"""
import dataclasses
import math

PACKINGS = ("auto", "none")


@dataclasses.dataclass(frozen=True)
class Part:
  """Replicas at positions [start, stop) of bucket `bucket` (grid order), trained together."""
  bucket: int
  start: int
  stop: int
  bucket_size: int

  @property
  def size(self):
    """The number of replicas."""
    return self.stop - self.start

  @property
  def whole(self):
    """Whether the part is its whole bucket."""
    return self.start == 0 and self.stop == self.bucket_size


@dataclasses.dataclass(frozen=True)
class Lane:
  """Devices (indices into the sweep's device list) and the parts they train, in order."""
  devices: tuple
  parts: tuple


@dataclasses.dataclass(frozen=True)
class Plan:
  """Lanes over `num_devices` devices, replicas split over `num_data` devices each."""
  lanes: tuple
  num_data: int
  num_devices: int
  makespan: float
  slot_use: float

  @property
  def parts(self):
    """Every part, in bucket and replica order."""
    return sorted((p for lane in self.lanes for p in lane.parts),
                  key=lambda p: (p.bucket, p.start))

  def describe(self):
    """One line: lanes, devices, parts and slot use."""
    lane_size = len(self.lanes[0].devices)
    return (f"{len(self.lanes)} lane{'s' * (len(self.lanes) > 1)} of {lane_size} "
            f"device{'s' * (lane_size > 1)} "
            f"({self.num_data} per replica), {len(self.parts)} parts, "
            f"{self.slot_use:.0%} of replica slots busy")


def part_time(size, groups, num_data, cost):
  """A part's duration: ceil(size / groups) rounds of cost / num_data."""
  return math.ceil(size / groups) * cost / num_data


def in_turn(sizes, costs, num_devices, num_data=1, num_processes=1):
  """The plan of buckets run one after another, each over one lane of all devices (on one
  process only as many device groups as the largest bucket fills, so a small sweep is not
  padded onto idle devices)."""
  _check(sizes, costs, num_devices, num_data)
  groups = num_devices // num_data
  if num_processes == 1:
    groups = min(groups, max(sizes))
  parts = tuple(Part(b, 0, n, n) for b, n in enumerate(sizes))
  return _plan([Lane(tuple(range(groups * num_data)), parts)], sizes, costs, num_devices,
               num_data)


def packed(sizes, costs, num_devices, num_data=1, device_processes=None):
  """The plan of lanes that keeps the most replica slots busy (ties: fewer parts, then fewer
  lanes), over every lane size that is a multiple of num_data and, with several processes, of
  their number (`device_processes`: the process index of each device; default all 0)."""
  _check(sizes, costs, num_devices, num_data)
  device_processes = list(device_processes or [0] * num_devices)
  processes = sorted(set(device_processes))
  local = {p: [i for i, q in enumerate(device_processes) if q == p] for p in processes}
  if len({len(v) for v in local.values()}) != 1:
    return in_turn(sizes, costs, num_devices, num_data, len(processes))
  best = None
  for lane_size in range(num_data, num_devices + 1, num_data):
    if num_devices % lane_size or lane_size % len(processes):
      continue
    lanes = _deal(sizes, costs, lane_size // num_data, num_data, num_devices // lane_size)
    per_process = lane_size // len(processes)
    devices = [tuple(i for p in processes for i in local[p][k * per_process:
                                                          (k + 1) * per_process])
               for k in range(len(lanes))]
    plan = _plan([Lane(d, tuple(parts)) for d, parts in zip(devices, lanes)], sizes, costs,
                 num_devices, num_data)
    key = (round(plan.slot_use, 9), -len(plan.parts), -len(plan.lanes))
    if best is None or key > best[0]:
      best = (key, plan)
  return best[1]


def check_setting(packing):
  """ValueError naming config.sweep.packing unless it is one of PACKINGS."""
  if packing not in PACKINGS:
    raise ValueError(f"config.sweep.packing={packing!r}: expected one of {', '.join(PACKINGS)}")


def choose(sizes, costs, num_devices, num_data=1, device_processes=None, packing="auto"):
  """The sweep's plan: `packed` when packing is "auto" and it keeps more replica slots busy than
  running the buckets in turn, else `in_turn` (packing: one of PACKINGS, checked by
  `check_setting` where the config is parsed)."""
  num_processes = len(set(device_processes or [0]))
  turn = in_turn(sizes, costs, num_devices, num_data, num_processes)
  if packing == "none":
    return turn
  plan = packed(sizes, costs, num_devices, num_data, device_processes)
  return plan if plan.slot_use > turn.slot_use + 1e-9 else turn


def _check(sizes, costs, num_devices, num_data):
  if not sizes or len(sizes) != len(costs) or min(sizes) < 1 or min(costs) <= 0:
    raise ValueError(f"sizes={sizes}, costs={costs}: expected one positive size and cost per "
                     "bucket")
  if num_data < 1 or num_devices % num_data:
    raise ValueError(f"num_data={num_data}: expected a positive divisor of the device count "
                     f"{num_devices}")


def _plan(lanes, sizes, costs, num_devices, num_data):
  makespan = max(sum(part_time(p.size, len(lane.devices) // num_data, num_data, costs[p.bucket])
                     for p in lane.parts) for lane in lanes)
  work = sum(n * c for n, c in zip(sizes, costs))
  return Plan(tuple(lanes), num_data, num_devices, makespan, work / (num_devices * makespan))


def _deal(sizes, costs, groups, num_data, num_lanes):
  """Parts per lane (at most num_lanes) of the smallest makespan that a contiguous deal in grid
  order reaches (bisection on the makespan; each lane takes whole rounds while they fit)."""
  low = max(costs) / num_data
  high = sum(part_time(n, groups, num_data, c) for n, c in zip(sizes, costs))
  lanes = _fill(sizes, costs, groups, num_data, high, num_lanes)
  for _ in range(60):
    middle = (low + high) / 2
    attempt = _fill(sizes, costs, groups, num_data, middle, num_lanes)
    if attempt is None:
      low = middle
    else:
      high, lanes = middle, attempt
  return lanes


def _fill(sizes, costs, groups, num_data, budget, num_lanes):
  """The contiguous deal of rounds (up to `groups` replicas of one bucket) onto lanes of at most
  `budget` each; None when num_lanes do not hold every replica."""
  lanes, parts, used = [], [], 0.0
  for bucket, (size, cost) in enumerate(zip(sizes, costs)):
    start, round_time = 0, cost / num_data
    while start < size:
      if parts and used + round_time > budget * (1 + 1e-12):
        lanes.append(parts)
        parts, used = [], 0.0
        if len(lanes) == num_lanes:
          return None
      if used + round_time > budget * (1 + 1e-12):
        return None
      stop = min(size, start + groups)
      if parts and parts[-1].bucket == bucket:
        parts[-1] = Part(bucket, parts[-1].start, stop, size)
      else:
        parts.append(Part(bucket, start, stop, size))
      used, start = used + round_time, stop
  lanes.append(parts)
  return lanes
