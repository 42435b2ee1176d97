# ptxas_regs.awk reads what ptxas -v prints (nvcc -Xptxas -v) and writes a
# line for each entry function whose mangled name matches the variable
# match_re (default: every one): name, registers, spill-store bytes and
# stack bytes, tab-separated. ptxas prints, per entry function: "Compiling
# entry function 'NAME'", then "N bytes stack frame, S bytes spill stores,
# L bytes spill loads", then "Used R registers". Used by ptxas_check.sh
# and variants.sh.
BEGIN { if (match_re == "") match_re = "." }
/Compiling entry function/ { name = $0; sub(/.*function .?/, "", name); sub(/.? for .*/, "", name); stack = spill = "" }
/bytes stack frame/ { stack = $1; spill = $5 }
/Used [0-9]+ registers/ && name != "" {
	regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
	if (name ~ match_re) printf "%s\t%s\t%s\t%s\n", name, regs, spill, stack
	name = ""
}
