// The official `e2b` JS SDK, unchanged, against `omabox serve --backend docker` (a busybox
// image of a test registry as `base`): commands, E2B's user added to the image, files,
// streamed output, a filesystem pause and `Sandbox.connect`, the kill. Every check throws
// on a wrong answer; the last line printed is `OK`. Access tokens seen are written to
// $TOKENS_OUT. Run from the npm prefix holding `e2b`.
import { writeFileSync } from 'node:fs'
import { Sandbox, CommandExitError } from 'e2b'

const tokens = []
function check(condition, what) {
  if (!condition) throw new Error(`FAILED: ${what}`)
  console.log(`ok: ${what}`)
}

const sbx = await Sandbox.create({ timeoutMs: 120_000, envs: { GREETING: 'hi' } })
tokens.push(sbx.envdAccessToken)
let r = await sbx.commands.run('echo $GREETING; echo oops >&2')
check(r.stdout === 'hi\n' && r.stderr === 'oops\n' && r.exitCode === 0, 'run: stdout, stderr, exit 0')
try {
  await sbx.commands.run('exit 3')
  throw new Error('FAILED: a failing command must throw')
} catch (e) {
  check(e instanceof CommandExitError && e.exitCode === 3, `a failing command throws its code (${e.message})`)
}
r = await sbx.commands.run('id -un; echo $HOME')
check(r.stdout === 'user\n/home/user\n', `E2B's user, added to the image: ${JSON.stringify(r.stdout)}`)
r = await sbx.commands.run('id -u', { user: 'root' })
check(r.stdout === '0\n', 'root when asked')

// Output streams as written.
const lines = []
await sbx.commands.run('echo one; sleep 0.2; echo two', { onStdout: (data) => lines.push(data) })
check(lines.join('') === 'one\ntwo\n' && lines.length >= 2, `streamed: ${JSON.stringify(lines)}`)

await sbx.files.write('/home/user/js.txt', 'written by js')
check((await sbx.files.read('/home/user/js.txt')) === 'written by js', 'a file')
const bytes = new Uint8Array(4096).map((_, i) => i % 256)
await sbx.files.write('/home/user/js.bin', bytes)
const back = await sbx.files.read('/home/user/js.bin', { format: 'bytes' })
check(back.length === bytes.length && back.every((b, i) => b === bytes[i]), 'a binary file')

// A filesystem pause keeps the files; connect resumes under the same id and token.
check((await sbx.pause()) === true, 'pause')
const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
check(again.sandboxId === sbx.sandboxId && again.envdAccessToken === sbx.envdAccessToken, 'the same id and token')
check((await again.files.read('/home/user/js.txt')) === 'written by js', 'the file survives the pause')
check((await again.commands.run('echo $GREETING')).stdout === 'hi\n', 'the envs are set again')
await again.kill()
const listed = await Sandbox.list().nextItems()
check(!listed.some((s) => s.sandboxId === sbx.sandboxId), 'killed')

writeFileSync(process.env.TOKENS_OUT, tokens.join('\n'))
console.log('OK')
