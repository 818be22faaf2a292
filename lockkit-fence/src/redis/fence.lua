-- lockkit's fenced write for Redis.
-- KEYS[1]: the resource's fence key, lockkit:fence:{RESOURCE}
-- ARGV[1]: the writer's fencing token, a decimal number without leading zeros
-- ARGV[2]: the resource, for the refusal's message
-- ARGV[3...]: the write, as commands: a count N, then the command's N words, again
-- A token below the fence's is refused (error STALE) and nothing is run;
-- otherwise the token is recorded and the commands run; their replies are returned.
local token = ARGV[1]
if #token > 20 or not (token == '0' or string.find(token, '^[1-9]%d*$')) then
    return redis.error_reply('ERR lockkit fence: the token must be a decimal number without leading zeros')
end
local last = #ARGV
local i = 3
while i <= last do
    local n = tonumber(ARGV[i])
    if not n or n < 1 or i + n > last then
        return redis.error_reply('ERR lockkit fence: a command is a count N followed by N words')
    end
    i = i + n + 1
end
-- Record the token and read the one before in one call; a stale token puts
-- the greater one back (the script is atomic: no one sees the swap).
local greatest = redis.call('SET', KEYS[1], token, 'GET')
if greatest and (#greatest > #token or (#greatest == #token and greatest > token)) then
    redis.call('SET', KEYS[1], greatest)
    return redis.error_reply('STALE lockkit fence: stale token ' .. token .. ' for resource "' ..
        ARGV[2] .. '": greatest admitted ' .. greatest)
end
local replies = {}
i = 3
while i <= last do
    local n = tonumber(ARGV[i])
    replies[#replies + 1] = redis.call(unpack(ARGV, i + 1, i + n))
    i = i + n + 1
end
return replies
