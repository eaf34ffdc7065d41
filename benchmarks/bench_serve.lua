-- Open-loop constant-rate load for wrk 4 (what wrk2 does, which Debian does not package).
--
-- Run with one connection per thread (wrk -t N -c N), so each Lua state is one connection:
--   wrk -t16 -c16 -d10s -s bench_serve.lua http://127.0.0.1:PORT/v1/forecast -- RATE BODIES
-- RATE is the total offered rate (req/s; 0 = closed loop, as fast as answers come), BODIES a
-- file of request bodies, one JSON document a line, posted in turn. Each connection sends
-- every N/RATE s on a fixed schedule (connections staggered evenly), and a request's latency
-- is counted from the time it was due, not from when it went out: a stall in the server
-- delays the requests queued behind it, and that delay is measured (no coordinated omission).
-- done() prints one JSON line: latencies in microseconds, statuses other than 200, errors.
local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bc_timespec;
int clock_gettime(int clk_id, bc_timespec *tp);
]]
local ts = ffi.new("bc_timespec")
local function now_us()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local period, nthreads, reqs, nreq, k = 0, 1, {}, 0, 0
local next_due, due = nil, 0
lat, bad, first_bad = {}, 0, ""

function init(args)
  local rate = tonumber(args[1]) or 0
  nthreads = tonumber(args[3]) or 1
  if rate > 0 then period = 1e6 * nthreads / rate end
  for line in io.lines(args[2]) do
    if #line > 0 then
      nreq = nreq + 1
      reqs[nreq] = wrk.format("POST", nil, {["Content-Type"] = "application/json"}, line)
    end
  end
  k = id
end

function request()
  local t = now_us()
  if next_due == nil then next_due = t + period * id / nthreads end
  if period > 0 then
    due = math.min(t, next_due) -- late: count from the due time; early (ms timer): from now
    next_due = next_due + period
  else
    due = t
  end
  k = k % nreq + 1
  return reqs[k]
end

function delay()
  if period == 0 or next_due == nil then return 0 end
  return math.max(0, math.floor((next_due - now_us()) / 1000))
end

function response(status, headers, body)
  lat[#lat + 1] = math.floor(now_us() - due)
  if status ~= 200 then
    bad = bad + 1
    if first_bad == "" then
      first_bad = tostring(status) .. " " .. string.sub(body, 1, 200):gsub("[^%w %.:,_%-]", "?")
    end
  end
end

function done(summary, latency, requests)
  local parts, nbad, fb = {}, 0, ""
  for _, thread in ipairs(threads) do
    local l = thread:get("lat")
    for i = 1, #l do parts[#parts + 1] = tostring(l[i]) end
    nbad = nbad + thread:get("bad")
    if fb == "" then fb = thread:get("first_bad") end
  end
  local e = summary.errors
  io.write(string.format(
    '\nBENCH_JSON {"lat_us":[%s],"non200":%d,"first_non200":"%s","duration_us":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeouts":%d}\n',
    table.concat(parts, ","), nbad, fb, summary.duration, e.connect, e.read, e.write,
    e.timeout))
end
