-- bench_serve.lua (the open-loop constant-rate generator, loaded unchanged) plus a check of
-- every answer's body, for POST /v1/plan (benchmarks/bench_serve_plan.py).
--
-- Same arguments as bench_serve.lua: RATE BODIES NTHREADS. Beside BODIES, the file
-- BODIES.expected holds, line for line, the answer each body must get (the planner is
-- deterministic, and bench_serve_plan.py validated each of those answers as a plan). A 200
-- whose body differs from its request's expected answer counts as bad like a non-200 (in the
-- same "non200" total, first_non200 saying "wrong plan"), and so does a request whose body is
-- not in BODIES. Latency is still counted from the due time by bench_serve.lua's response().
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "bench_serve.lua")

local base_init, base_request, base_response = init, request, response
local expected, current = {}, nil

function init(args)
  base_init(args)
  local want = io.open(args[2] .. ".expected", "r")
  if want == nil then error("bench_serve_plan.lua: no " .. args[2] .. ".expected") end
  for body in io.lines(args[2]) do
    if #body > 0 then
      local answer = want:read("*l")
      if answer == nil then error("bench_serve_plan.lua: fewer answers than bodies") end
      expected[body] = answer
    end
  end
  want:close()
end

function request()
  local req = base_request()
  local head_end = req:find("\r\n\r\n", 1, true)
  current = head_end and expected[req:sub(head_end + 4)] or nil
  return req
end

function response(status, headers, body)
  base_response(status, headers, body)
  if status == 200 and body ~= current then
    bad = bad + 1
    if first_bad == "" then
      first_bad = current == nil and "unknown request body" or
          ("wrong plan: " .. string.sub(body, 1, 120):gsub("[^%w %.:,_%-]", "?"))
    end
  end
end
